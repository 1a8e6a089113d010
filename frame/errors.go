package frame

import "fmt"

// Stable protocol error names, shared with protocol/vectors and every other
// implementation.
const (
	NameTruncated     = "truncated"       // input ended inside a hello, header or body
	NameBadMagic      = "bad_magic"       // hello does not start with "UDSK"
	NameBadVersion    = "bad_version"     // version 0, or no common version
	NameBadLimits     = "bad_limits"      // hello announces max frame under MinMaxFrame
	NameFrameTooLarge = "frame_too_large" // payload length over the negotiated max frame
	NameHeadTooLarge  = "head_too_large"  // head length over MaxHead
	NameBadID         = "bad_id"          // id 0 where a call id is needed, or nonzero where not
	NameBadCode       = "bad_code"        // error frame with code 0
	NameBadHead       = "bad_head"        // head section does not parse
)

// ProtocolError is a violation of protocol/spec.md by the peer. Name is one of
// the Name* constants; errors.Is matches on Name.
type ProtocolError struct {
	Name   string
	Detail string
}

func (e *ProtocolError) Error() string {
	if e.Detail == "" {
		return "udskit protocol: " + e.Name
	}
	return "udskit protocol: " + e.Name + ": " + e.Detail
}

// Is makes errors.Is(err, frame.ErrTruncated) and the like work.
func (e *ProtocolError) Is(target error) bool {
	t, ok := target.(*ProtocolError)
	return ok && t.Name == e.Name && t.Detail == ""
}

// Sentinels for errors.Is.
var (
	ErrTruncated     = &ProtocolError{Name: NameTruncated}
	ErrBadMagic      = &ProtocolError{Name: NameBadMagic}
	ErrBadVersion    = &ProtocolError{Name: NameBadVersion}
	ErrBadLimits     = &ProtocolError{Name: NameBadLimits}
	ErrFrameTooLarge = &ProtocolError{Name: NameFrameTooLarge}
	ErrHeadTooLarge  = &ProtocolError{Name: NameHeadTooLarge}
	ErrBadID         = &ProtocolError{Name: NameBadID}
	ErrBadCode       = &ProtocolError{Name: NameBadCode}
	ErrBadHead       = &ProtocolError{Name: NameBadHead}
)

func protoErr(name, format string, args ...any) *ProtocolError {
	return &ProtocolError{Name: name, Detail: fmt.Sprintf(format, args...)}
}
