// Package frame is udskit's wire format: the connection hello, the fixed
// 16-byte little-endian frame header, the head sections (method, metadata,
// error message), and a Reader and Writer that allocate nothing per frame at
// steady state.
//
// protocol/spec.md is the normative description; protocol/vectors/*.json is
// its executable form and is checked by this package's tests.
//
// Decoding never allocates a length the peer merely claimed: every length is
// checked against the negotiated limits before any buffer is sized for it, and
// every violation is a *ProtocolError with a stable Name shared with the
// vectors ("truncated", "bad_magic", "frame_too_large", ...).
package frame
