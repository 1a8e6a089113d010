package grpccred_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/udskit/udskit/grpccred"
	"github.com/udskit/udskit/internal/grpcecho" // registers the raw codec
	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/uds"
)

func TestMain(m *testing.M) {
	testutil.Main(m, map[string]testutil.HelperFunc{"whoami": helperWhoami})
}

// whoResult is what the helper process prints: who it is, and what the
// server's handler saw (or the error of its first RPC).
type whoResult struct {
	PID  int      `json:"pid"`
	UID  int      `json:"uid"`
	Code string   `json:"code"`
	Msg  string   `json:"msg"`
	Seen uds.Cred `json:"seen"`
	// Server is the server process's credentials, as the client's
	// handshake saw them.
	Server uds.Cred `json:"server"`
}

const whoMethod = "/udskit.test.Who/Whoami"

// helperWhoami dials the socket at arg with grpccred's client credentials
// and makes one RPC.
func helperWhoami(arg string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res := whoResult{PID: os.Getpid(), UID: os.Getuid()}
	cc, err := grpc.NewClient("unix://"+arg, grpc.WithTransportCredentials(grpccred.NewClient(grpccred.ClientOptions{})))
	if err != nil {
		res.Code, res.Msg = "dial", err.Error()
		return testutil.PrintJSON(res)
	}
	defer cc.Close()
	var out []byte
	var p peer.Peer
	err = cc.Invoke(ctx, whoMethod, []byte("{}"), &out, grpc.CallContentSubtype(grpcecho.CodecName), grpc.Peer(&p))
	res.Code = status.Code(err).String()
	if err != nil {
		res.Msg = err.Error()
	} else if err := json.Unmarshal(out, &res.Seen); err != nil {
		res.Code, res.Msg = "decode", err.Error()
	}
	if ai, ok := p.AuthInfo.(grpccred.AuthInfo); ok {
		res.Server = ai.Cred
	}
	return testutil.PrintJSON(res)
}

// whoServer is a grpc-go server whose one method answers with the caller's
// credentials as its handler sees them (peer.FromContext), counting calls.
type whoServer struct {
	calls atomic.Int64
}

func (w *whoServer) desc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: "udskit.test.Who",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Whoami", Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			w.calls.Add(1)
			var in []byte
			if err := dec(&in); err != nil {
				return nil, err
			}
			p, ok := peer.FromContext(ctx)
			if !ok {
				return nil, status.Error(codes.Internal, "no peer")
			}
			ai, ok := p.AuthInfo.(grpccred.AuthInfo)
			if !ok {
				return nil, status.Errorf(codes.Internal, "AuthInfo is %T", p.AuthInfo)
			}
			if ai.SecurityLevel != credentials.PrivacyAndIntegrity {
				return nil, status.Errorf(codes.Internal, "security level %v", ai.SecurityLevel)
			}
			if c, ok := grpccred.FromContext(ctx); !ok || c != ai.Cred {
				return nil, status.Errorf(codes.Internal, "FromContext: %v %v", c, ok)
			}
			b, _ := json.Marshal(ai.Cred)
			return &b, nil
		}}},
	}
}

// serveGRPC serves a whoServer with creds on a uds.Listen socket any user
// may connect to (mode 0666 in a dir anyone may search) and returns its path.
func serveGRPC(t *testing.T, creds credentials.TransportCredentials, lopts uds.ListenOptions) (*whoServer, string) {
	t.Helper()
	path := filepath.Join(testutil.ShortDir(t, 0o755), "grpc.sock")
	lopts.Mode = 0o666
	l, err := uds.Listen(context.Background(), "unix:"+path, lopts)
	if err != nil {
		t.Fatal(err)
	}
	w := &whoServer{}
	srv := grpc.NewServer(grpc.Creds(creds))
	srv.RegisterService(w.desc(), nil)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return w, path
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// An allowed client, another process, reaches its handler, which sees the
// client's real pid and uid; the client sees the server's.
func TestAllowedClientSeesRealPIDAndUID(t *testing.T) {
	creds := grpccred.NewServer(grpccred.ServerOptions{Policy: uds.AllowUIDs(uint32(os.Getuid())), Logger: quietLog()})
	w, path := serveGRPC(t, creds, uds.ListenOptions{})
	var res whoResult
	testutil.RunJSON(t, testutil.HelperCmd(t, "whoami", path), &res)
	if res.Code != codes.OK.String() {
		t.Fatalf("allowed client's RPC: %s %s", res.Code, res.Msg)
	}
	if int(res.Seen.PID) != res.PID || int(res.Seen.UID) != res.UID || res.PID == os.Getpid() {
		t.Fatalf("handler saw %+v; the client is pid %d uid %d (this test is pid %d)", res.Seen, res.PID, res.UID, os.Getpid())
	}
	if int(res.Server.PID) != os.Getpid() || int(res.Server.UID) != os.Getuid() {
		t.Fatalf("client saw the server as %+v; want pid %d uid %d", res.Server, os.Getpid(), os.Getuid())
	}
	if w.calls.Load() != 1 || creds.Refused() != 0 {
		t.Fatalf("handler calls %d, refused %d; want 1, 0", w.calls.Load(), creds.Refused())
	}
}

// A client running as nobody is refused at the handshake: its first RPC
// fails (unavailable) and no handler ever ran.
func TestNobodyRefusedBeforeFirstRPC(t *testing.T) {
	var logged testutil.Buffer
	creds := grpccred.NewServer(grpccred.ServerOptions{Policy: uds.AllowUIDs(0),
		Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	w, path := serveGRPC(t, creds, uds.ListenOptions{})
	var res whoResult
	testutil.RunJSON(t, testutil.NobodyCmd(t, "whoami", path), &res)
	if res.UID != testutil.NobodyUID {
		t.Fatalf("the helper ran as uid %d, not nobody", res.UID)
	}
	if res.Code != codes.Unavailable.String() {
		t.Fatalf("nobody's RPC: %s %s; want unavailable (refused at the handshake)", res.Code, res.Msg)
	}
	if w.calls.Load() != 0 {
		t.Fatalf("a handler ran %d time(s) for a refused client", w.calls.Load())
	}
	if creds.Refused() == 0 {
		t.Fatal("the refusal was not counted")
	}
	want := fmt.Sprintf("uid=%d", testutil.NobodyUID)
	if s := logged.String(); !strings.Contains(s, "refused at the handshake") || !strings.Contains(s, want) || !strings.Contains(s, "not in [0]") {
		t.Fatalf("refusal log %q lacks the reason and %s", s, want)
	}
}

// Combined with uds.Listen's own accept-time policy: the listener refuses
// nobody before gRPC even sees the connection, and the credentials it read
// reach the handler unchanged for an allowed caller.
func TestCombinedWithListenPolicy(t *testing.T) {
	creds := grpccred.NewServer(grpccred.ServerOptions{Logger: quietLog()})
	w, path := serveGRPC(t, creds, uds.ListenOptions{Policy: uds.AllowRoot(), Logger: quietLog()})
	var res whoResult
	testutil.RunJSON(t, testutil.NobodyCmd(t, "whoami", path), &res)
	if res.Code != codes.Unavailable.String() || w.calls.Load() != 0 {
		t.Fatalf("nobody through uds.Listen's policy: %s %s, %d handler calls", res.Code, res.Msg, w.calls.Load())
	}
	testutil.RunJSON(t, testutil.HelperCmd(t, "whoami", path), &res)
	if res.Code != codes.OK.String() || int(res.Seen.PID) != res.PID || res.Seen.UID != 0 {
		t.Fatalf("root through uds.Listen: %+v", res)
	}
}

// The client's policy checks the server process: a server not running as
// the uid the client wants is refused before the first RPC.
func TestClientPolicyRefusesServer(t *testing.T) {
	creds := grpccred.NewServer(grpccred.ServerOptions{Logger: quietLog()})
	w, path := serveGRPC(t, creds, uds.ListenOptions{})
	cc, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(
		grpccred.NewClient(grpccred.ClientOptions{Policy: uds.AllowUIDs(12345)})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []byte
	err = cc.Invoke(ctx, whoMethod, []byte("{}"), &out, grpc.CallContentSubtype(grpcecho.CodecName))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "refused by the client's policy") {
		t.Fatalf("call to a server the client's policy refuses: %v", err)
	}
	if w.calls.Load() != 0 {
		t.Fatal("the handler ran")
	}
}

// TCP carries no kernel credentials: the server refuses it.
func TestTCPRefused(t *testing.T) {
	creds := grpccred.NewServer(grpccred.ServerOptions{Logger: quietLog()})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := &whoServer{}
	srv := grpc.NewServer(grpc.Creds(creds))
	srv.RegisterService(w.desc(), nil)
	go srv.Serve(l)
	defer srv.Stop()
	cc, err := grpc.NewClient("passthrough:///"+l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []byte
	err = cc.Invoke(ctx, whoMethod, []byte("{}"), &out, grpc.CallContentSubtype(grpcecho.CodecName))
	if status.Code(err) != codes.Unavailable || w.calls.Load() != 0 || creds.Refused() == 0 {
		t.Fatalf("TCP call: %v, %d handler calls, %d refused", err, w.calls.Load(), creds.Refused())
	}
	_, _, herr := creds.ServerHandshake(&net.TCPConn{})
	if !errors.Is(herr, grpccred.ErrNotUnix) || !errors.Is(herr, uds.ErrPeerRefused) {
		t.Fatalf("handshake error on a TCP conn: %v", herr)
	}
}
