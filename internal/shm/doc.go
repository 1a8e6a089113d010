// Package shm is the shared-memory data path of the udskit protocol
// (protocol/spec.md, section 10): the sealed memfd region a client offers
// once per connection, the 8-byte descriptors that stand for payloads in
// it, the writer's slot allocator for its half and the receiver's checks.
//
// Nothing here trusts the region's contents: the allocator's state is
// private memory, and every offset a peer sends is checked (Tracker) before
// Region.Bytes hands out a slice. The region's size is sealed before it is
// mapped (OpenOffer), so no access inside it can fault.
//
// Linux only: on other systems Supported is false, Create and OpenOffer fail,
// and callers keep to the socket.
package shm
