package rpc

import (
	"context"
	"io"
	"testing"

	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestBidiProto: the protobuf variants, bidi (a running total of Int64Value
// items) and client-streaming (their count), typed on both sides.
func TestBidiProto(t *testing.T) {
	s := NewServer(ServerOptions{})
	HandleProtoBidi(s, "psum", func(ctx context.Context, recv func() (*wrapperspb.Int64Value, error), send func(*wrapperspb.Int64Value) error) error {
		var total int64
		for {
			v, err := recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			total += v.Value
			if err := send(wrapperspb.Int64(total)); err != nil {
				return err
			}
		}
	})
	HandleProtoClientStream(s, "pcount", func(ctx context.Context, recv func() (*wrapperspb.StringValue, error)) (*wrapperspb.Int64Value, error) {
		var n int64
		for {
			if _, err := recv(); err == io.EOF {
				return wrapperspb.Int64(n), nil
			} else if err != nil {
				return nil, err
			}
			n++
		}
	})
	c := dial(t, startServer(t, s))
	ctx := context.Background()
	st, err := OpenProtoBidi[*wrapperspb.Int64Value, wrapperspb.Int64Value](ctx, c, "psum")
	if err != nil {
		t.Fatal(err)
	}
	want := int64(0)
	for _, n := range []int64{3, 4, -10} {
		st.Send(wrapperspb.Int64(n))
		want += n
		got, err := st.Recv()
		if err != nil || got.Value != want {
			t.Fatalf("total %v %v, want %d", got, err, want)
		}
	}
	st.CloseSend()
	if _, err := st.Recv(); err != io.EOF {
		t.Fatal(err)
	}
	cs, err := OpenProtoClientStream[*wrapperspb.StringValue, wrapperspb.Int64Value](ctx, c, "pcount")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"a", "b", "c"} {
		cs.Send(wrapperspb.String(s))
	}
	if got, err := cs.CloseAndRecv(); err != nil || got.Value != 3 {
		t.Fatalf("count %v %v", got, err)
	}
	// A bidi item that is not the handler's message type fails the call
	// with invalid_argument.
	bad, _ := c.Bidi(ctx, "psum")
	bad.SendRaw([]byte{0xff, 0xff, 0xff})
	if _, err := bad.RecvRaw(); CodeOf(err) != InvalidArgument {
		t.Fatalf("a bad item: %v", err)
	}
}
