package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"syscall"

	"github.com/udskit/udskit/frame"
	"github.com/udskit/udskit/uds"
)

// Code classifies an error. The numbers are on the wire (protocol/spec.md)
// and follow gRPC's where the meaning is the same.
type Code uint32

// Error codes.
const (
	OK                 Code = 0
	Canceled           Code = 1
	Unknown            Code = 2
	InvalidArgument    Code = 3
	DeadlineExceeded   Code = 4
	NotFound           Code = 5
	AlreadyExists      Code = 6
	PermissionDenied   Code = 7
	ResourceExhausted  Code = 8
	FailedPrecondition Code = 9
	Aborted            Code = 10
	OutOfRange         Code = 11
	Unimplemented      Code = 12 // unknown method, or wrong call kind
	Internal           Code = 13 // handler panic
	Unavailable        Code = 14 // connection lost, server draining: retryable
	DataLoss           Code = 15
	Unauthenticated    Code = 16
	ProtocolViolation  Code = 32 // the peer broke protocol/spec.md; the connection is closed
)

var codeNames = map[Code]string{
	OK: "ok", Canceled: "canceled", Unknown: "unknown", InvalidArgument: "invalid_argument",
	DeadlineExceeded: "deadline_exceeded", NotFound: "not_found", AlreadyExists: "already_exists",
	PermissionDenied: "permission_denied", ResourceExhausted: "resource_exhausted",
	FailedPrecondition: "failed_precondition", Aborted: "aborted", OutOfRange: "out_of_range",
	Unimplemented: "unimplemented", Internal: "internal", Unavailable: "unavailable",
	DataLoss: "data_loss", Unauthenticated: "unauthenticated", ProtocolViolation: "protocol_violation",
}

// ParseCode maps a code name ("not_found", as in protocol/codes.json) or a
// decimal number ("5") to a Code.
func ParseCode(s string) (Code, bool) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return Code(n), true
	}
	for c, name := range codeNames {
		if name == s {
			return c, true
		}
	}
	return 0, false
}

func (c Code) String() string {
	if s, ok := codeNames[c]; ok {
		return s
	}
	return "code_" + strconv.FormatUint(uint64(c), 10)
}

// Error is an RPC failure with a code. Handlers return one to choose the code
// the caller sees; any other error reaches the caller as Unknown with its text.
type Error struct {
	Code    Code
	Message string
	// Details is optional opaque data (for example JSON) for the caller.
	Details []byte
	// Refused is set when the server did not process the call at all (it was
	// draining), so sending it again cannot do anything twice.
	Refused bool

	cause error
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "rpc error: " + e.Code.String()
	}
	return "rpc error: " + e.Code.String() + ": " + e.Message
}

// Unwrap returns the local cause (a context error, a connection error), if any.
func (e *Error) Unwrap() error { return e.cause }

// Is matches another *Error by code, context.Canceled /
// context.DeadlineExceeded by the corresponding code, and ErrStreamingMethod
// / ErrUnaryMethod by the server's wrong-kind refusal.
func (e *Error) Is(target error) bool {
	switch target {
	case context.Canceled:
		return e.Code == Canceled
	case context.DeadlineExceeded:
		return e.Code == DeadlineExceeded
	case ErrStreamingMethod:
		return e.Code == Unimplemented && strings.Contains(e.Message, streamingWords)
	case ErrUnaryMethod:
		return e.Code == Unimplemented && strings.Contains(e.Message, unaryWords)
	case ErrBidiMethod:
		return e.Code == Unimplemented && strings.Contains(e.Message, bidiWords)
	case ErrClientStreamMethod:
		return e.Code == Unimplemented && strings.Contains(e.Message, clientStreamWords)
	}
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && t.Message == ""
}

// ErrStreamingMethod and ErrUnaryMethod match (errors.Is) a server's refusal
// of a call of the wrong kind: a unary Call of a server-streaming method (call
// it with Client.Stream), and a Stream of a unary method (call it with Call).
// The wire has one code for both, unimplemented (protocol/spec.md, section 4),
// so the refusal is told apart from an unknown method by its words, which
// every udskit server (Go, Node, Python) uses: "is server-streaming" and "is
// unary". A caller that does not know a method's kind tries Call and, on
// ErrStreamingMethod, Stream (as `udskit call` does).
var (
	ErrStreamingMethod = errors.New("rpc: the method is server-streaming; call it with Stream")
	ErrUnaryMethod     = errors.New("rpc: the method is unary; call it with Call")
	// ErrBidiMethod and ErrClientStreamMethod match the refusal of a call
	// of a bidirectional method (open it with Bidi) or a client-streaming
	// one (ClientStreaming) made as another kind; their words are "is a
	// bidirectional stream" and "is a client stream" (protocol/spec.md 4.3).
	ErrBidiMethod         = errors.New("rpc: the method is a bidirectional stream; open it with Bidi")
	ErrClientStreamMethod = errors.New("rpc: the method is a client stream; open it with ClientStreaming")
)

// The words a wrong-kind refusal carries (servercall.go, ndjson.go; the Node
// and Python servers send the same).
const (
	streamingWords    = "is server-streaming"
	unaryWords        = "is unary"
	bidiWords         = "is a bidirectional stream"
	clientStreamWords = "is a client stream"
)

// wrongKind is the server's refusal of a call of the wrong kind.
func wrongKind(method string, stream bool, ndjson bool) *Error {
	switch {
	case stream:
		return Errorf(Unimplemented, "method %q %s; call it with Call, not Stream", method, unaryWords)
	case ndjson:
		return Errorf(Unimplemented, "method %q %s; NDJSON clients can make unary calls only", method, streamingWords)
	}
	return Errorf(Unimplemented, "method %q %s; call it with Stream", method, streamingWords)
}

// Retryable reports whether the call may be sent again: the connection was
// lost or the server was draining.
func (e *Error) Retryable() bool { return e.Code == Unavailable }

// Errorf returns an *Error with code and a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrEncode and ErrDecode are the causes of errors the client makes itself,
// never the server: a request value its codec could not encode (nothing was
// sent; Code InvalidArgument), and a response or stream item the server sent
// that the client's codec could not decode into the value given (the server
// processed the call; Code Internal, as in gRPC). Tell them apart from a
// server's own invalid_argument with errors.Is(err, rpc.ErrDecode).
var (
	ErrEncode = errors.New("client could not encode the request")
	ErrDecode = errors.New("client could not decode the response")
)

// encodeError and decodeError build the errors of ErrEncode and ErrDecode.
func encodeError(what string, err error) *Error {
	return &Error{Code: InvalidArgument, Message: "client: encode " + what + " (not sent): " + err.Error(), cause: errors.Join(ErrEncode, err)}
}

func decodeError(what string, err error) *Error {
	return &Error{Code: Internal, Message: "client: decode " + what + " (the server answered; its bytes do not decode into the value given): " + err.Error(),
		cause: errors.Join(ErrDecode, err)}
}

// Sentinels for errors.Is(err, rpc.ErrUnavailable) and friends: they match
// any *Error with the same code.
var (
	ErrUnavailable   = &Error{Code: Unavailable}
	ErrUnimplemented = &Error{Code: Unimplemented}
	ErrInternal      = &Error{Code: Internal}
)

// ErrClientClosed is the cause of calls made after Client.Close.
var ErrClientClosed = errors.New("rpc: client closed")

// ErrClosedBeforeHello matches (errors.Is) a Dial whose server closed the
// connection before sending its hello: the usual sign that the server refused
// the client (its peer-credential policy or its connection limit), is shutting
// down, or is not a udskit rpc server.
var ErrClosedBeforeHello = errors.New("the server closed the connection before its hello")

// HandshakeError is a failed hello exchange in Dial or NewClient. errors.Is
// sees through it to the socket error (syscall.ECONNRESET, syscall.EPIPE,
// io.EOF, a timeout) and, when Closed, to ErrClosedBeforeHello.
type HandshakeError struct {
	Addr string // the address dialed ("" for NewClient)
	// Closed is set when the server closed (or reset) the connection before
	// sending a single byte of its hello.
	Closed bool
	// Cause, when set, says in words what went wrong (a TLS refusal, a
	// plaintext client on a TLS port).
	Cause string
	Err   error
}

func (e *HandshakeError) Error() string {
	where := "rpc: "
	if e.Addr != "" {
		where = "rpc: dial " + e.Addr + ": "
	}
	if e.Cause != "" {
		return where + e.Cause + " (" + e.Err.Error() + ")"
	}
	if e.Closed {
		return where + ErrClosedBeforeHello.Error() +
			" (refused by its peer policy or connection limit, shutting down, or not a udskit rpc server): " + e.Err.Error()
	}
	return where + "the server did not answer with a udskit hello (not a udskit rpc server?): " + e.Err.Error()
}

// Unwrap returns the underlying error and, when Closed, ErrClosedBeforeHello.
func (e *HandshakeError) Unwrap() []error {
	if e.Closed {
		return []error{ErrClosedBeforeHello, e.Err}
	}
	return []error{e.Err}
}

// isClosedErr reports whether err means the peer closed or reset the
// connection.
func isClosedErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("rpc: server closed")

// CodeOf returns the code of err: the *Error's code, Canceled or
// DeadlineExceeded for context errors, OK for nil, Unknown otherwise.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return Canceled
	}
	// Dial errors (protocol/errors.json): no server to talk to is Unavailable;
	// one that answers in another protocol is ProtocolViolation.
	var he *HandshakeError
	var pe *frame.ProtocolError
	var de *uds.DialError
	switch {
	case errors.As(err, &he) && errors.As(he.Err, &pe):
		return ProtocolViolation
	case errors.As(err, &he), errors.As(err, &de):
		return Unavailable
	}
	return Unknown
}

// IsRetryable reports whether err (from Dial or a call) may succeed if tried
// again: its code (CodeOf) is Unavailable. A refusal (PermissionDenied) is not.
func IsRetryable(err error) bool { return err != nil && CodeOf(err) == Unavailable }

func toError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: CodeOf(err), Message: err.Error(), cause: err}
}

func ctxError(ctx context.Context) *Error {
	err := ctx.Err()
	if errors.Is(err, context.DeadlineExceeded) {
		return &Error{Code: DeadlineExceeded, Message: "deadline exceeded", cause: err}
	}
	return &Error{Code: Canceled, Message: "canceled", cause: err}
}

// RefusalNotice is what a udskit server tells a peer its policy refused
// (spec 5.4): one connection-level error frame, code PermissionDenied, in
// place of the hello. The message names the peer's uid, not the policy (the
// allowed list is not the peer's business). Server.Serve sets it on a
// *uds.Listener (uds.Listener.SetRefusalNotice).
func RefusalNotice(cr uds.Cred, _ error) []byte {
	msg := fmt.Sprintf("the server's peer policy refused this connection (uid %d): permanent, "+
		"retrying will not help; ask the server's operator to allow this user", cr.UID)
	h := frame.Header{Type: frame.TypeError, HeadLen: uint16(len(msg)), Aux: uint32(PermissionDenied)}
	return append(h.Append(nil), msg...)
}

// RefusedError is a dial the server refused before its hello, telling why
// (spec 5.4): Error carries the code (PermissionDenied for a peer policy,
// not retryable) and the server's message.
type RefusedError struct {
	Addr string
	Err  *Error
}

func (e *RefusedError) Error() string {
	where := "rpc: "
	if e.Addr != "" {
		where = "rpc: dial " + e.Addr + ": "
	}
	return where + "refused by the server: " + e.Err.Code.String() + ": " + e.Err.Message
}

// Unwrap returns the *Error, so CodeOf and errors.As see its code.
func (e *RefusedError) Unwrap() error { return e.Err }
