package grpcecho

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
)

// MaxMessageSize is the largest message the echo server and client send or
// receive: 64 MiB, the same cap as the bench's other transports
// (grpc-go's own default is 4 MiB for receiving, which would make every size
// above 4 MiB fail). Larger messages fail with codes.ResourceExhausted.
const MaxMessageSize = 64 << 20

// CodecName is the content-subtype under which the raw codec is registered.
const CodecName = "udskit-raw"

// FullMethod is the gRPC method path of the echo call.
const FullMethod = "/udskit.bench.Echo/Echo"

// rawCodec passes byte slices through without copying.
type rawCodec struct{}

func (rawCodec) Name() string { return CodecName }

func (rawCodec) Marshal(v any) ([]byte, error) {
	switch b := v.(type) {
	case []byte:
		return b, nil
	case *[]byte:
		return *b, nil
	}
	return nil, fmt.Errorf("grpcecho: raw codec cannot marshal %T", v)
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	p, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("grpcecho: raw codec cannot unmarshal into %T", v)
	}
	// gRPC may reuse data after Unmarshal returns, so keep a copy.
	*p = append((*p)[:0], data...)
	return nil
}

func init() { encoding.RegisterCodec(rawCodec{}) }

// echoServer is the (empty) implementation type named in the ServiceDesc.
type echoServer interface{}

type echoImpl struct{}

func echoHandler(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
	var in []byte
	if err := dec(&in); err != nil {
		return nil, err
	}
	return &in, nil
}

// FullStreamMethod is the gRPC method path of the bidirectional echo: each
// message the client sends is sent back, until the client closes its side.
const FullStreamMethod = "/udskit.bench.Echo/EchoStream"

func echoStreamHandler(_ any, stream grpc.ServerStream) error {
	var in []byte
	for {
		if err := stream.RecvMsg(&in); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		if err := stream.SendMsg(&in); err != nil {
			return err
		}
	}
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: "udskit.bench.Echo",
	HandlerType: (*echoServer)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "Echo", Handler: echoHandler}},
	Streams: []grpc.StreamDesc{{StreamName: "EchoStream", Handler: echoStreamHandler,
		ServerStreams: true, ClientStreams: true}},
	Metadata: "grpcecho (hand-written, no protoc)",
}

// NewServer returns a grpc.Server with the echo service registered. Serve it
// on any net.Listener (unix or tcp). Messages up to MaxMessageSize are
// accepted; opts come after that default and may override it.
func NewServer(opts ...grpc.ServerOption) *grpc.Server {
	all := append([]grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxMessageSize),
		grpc.MaxSendMsgSize(MaxMessageSize),
	}, opts...)
	s := grpc.NewServer(all...)
	s.RegisterService(&serviceDesc, echoImpl{})
	return s
}

// Client calls the echo service.
type Client struct {
	cc *grpc.ClientConn
}

// Dial connects to an echo server; calls send and receive messages up to
// MaxMessageSize. network is "unix" or "tcp"; address is a
// socket path ("@name" for the abstract namespace) or host:port.
func Dial(ctx context.Context, network, address string) (*Client, error) {
	return DialCreds(ctx, network, address, insecure.NewCredentials())
}

// DialCreds is Dial with transport credentials (TLS for the bench's grpc-tls row).
func DialCreds(ctx context.Context, network, address string, creds credentials.TransportCredentials) (*Client, error) {
	if network != "unix" && network != "tcp" {
		return nil, fmt.Errorf("grpcecho: network %q: want unix or tcp", network)
	}
	target := "passthrough:///" + strings.TrimPrefix(address, "/")
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, address)
	}
	cc, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(dialer),
		grpc.WithDefaultCallOptions(
			grpc.CallContentSubtype(CodecName),
			grpc.MaxCallRecvMsgSize(MaxMessageSize),
			grpc.MaxCallSendMsgSize(MaxMessageSize),
		),
	)
	if err != nil {
		return nil, fmt.Errorf("grpcecho: %w", err)
	}
	cc.Connect()
	if err := ctx.Err(); err != nil {
		cc.Close()
		return nil, err
	}
	return &Client{cc: cc}, nil
}

// Echo sends p and returns what the server sent back.
func (c *Client) Echo(ctx context.Context, p []byte) ([]byte, error) {
	var out []byte
	if err := c.cc.Invoke(ctx, FullMethod, p, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// EchoStream is one bidirectional echo call (FullStreamMethod).
type EchoStream struct {
	s   grpc.ClientStream
	out []byte
}

// OpenEchoStream starts a bidirectional echo call; it lasts until ctx ends or
// Close.
func (c *Client) OpenEchoStream(ctx context.Context) (*EchoStream, error) {
	s, err := c.cc.NewStream(ctx, &serviceDesc.Streams[0], FullStreamMethod)
	if err != nil {
		return nil, err
	}
	return &EchoStream{s: s}, nil
}

// Echo sends p on the stream and returns the echo (valid until the next Echo).
func (e *EchoStream) Echo(p []byte) ([]byte, error) {
	if err := e.s.SendMsg(p); err != nil {
		return nil, err
	}
	if err := e.s.RecvMsg(&e.out); err != nil {
		return nil, err
	}
	return e.out, nil
}

// Close ends the client's side of the stream.
func (e *EchoStream) Close() error { return e.s.CloseSend() }

// Close closes the client connection.
func (c *Client) Close() error { return c.cc.Close() }

// ForceRawCodec makes a server use the raw codec whatever content-subtype a
// client sends, for clients that cannot set one (grpc-js always sends plain
// "application/grpc", which grpc-go would otherwise decode as protobuf).
func ForceRawCodec() grpc.ServerOption { return grpc.ForceServerCodec(rawCodec{}) }
