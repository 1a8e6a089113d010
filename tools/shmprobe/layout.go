package main

// The region's layout (futex, spin and sock variants). A 64 KiB header of
// 64-byte lines, then a request slot per caller, then an answer slot per
// caller, each the payload size rounded up to 4 KiB; the whole a multiple of
// 64 KiB (internal/shm.CheckSize).
//
//	offStop     the client sets it to end the server
//	offSrvBell  the client adds 1 after each request it posts (futex word)
//	offSrvSleep 1 while the server is about to sleep or sleeps on offSrvBell
//	offCliBell  the server adds 1 after each batch of answers (futex word)
//	offCliSleep 1 while the client's poller is about to sleep or sleeps
//	caller i, at offCallers + i*callerLine: request sequence (+0), request
//	length (+4), sleeping (+8, futexd: 1 while the caller sleeps on its
//	answer sequence), written by the client; answer sequence (+64), answer
//	length (+68), written by the server, a line apart so neither writes the
//	other's.
const (
	hdrSize     = 64 << 10
	offStop     = 64
	offSrvBell  = 128
	offSrvSleep = 192
	offCliBell  = 256
	offCliSleep = 320
	offCallers  = 1024
	callerLine  = 128
	maxCallers  = (hdrSize - offCallers) / callerLine
	slotAlign   = 4 << 10
	regionAlign = 64 << 10
	frameSize   = 16 // sock variant: caller index, sequence, length, zero
)

// slotSize is a slot's size for payloads of size bytes.
func slotSize(size int) int { return (size + slotAlign - 1) / slotAlign * slotAlign }

// regionSize is the region for n callers of size bytes.
func regionSize(n, size int) int {
	s := hdrSize + 2*n*slotSize(size)
	return (s + regionAlign - 1) / regionAlign * regionAlign
}

// childEnv names the variant a re-executed child serves.
const childEnv = "SHMPROBE_CHILD"
