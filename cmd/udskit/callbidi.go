package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/udskit/udskit/rpc"
)

// maxItemLine caps one stdin line of a client-stream or bidi call.
const maxItemLine = 16 << 20

// callClientStream drives a bidirectional (bidi) or client-streaming call of
// method: the request items are item when given, else stdin's lines (one
// JSON value each; blank lines skipped; with raw, each line's bytes as they
// are), sent as they are read; the responses are printed as they arrive.
func callClientStream(ctx context.Context, cl *rpc.Client, method string, bidi bool, item []byte, stdin io.Reader, out io.Writer, raw bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var st *rpc.BidiStream
	var err error
	if bidi {
		st, err = cl.Bidi(ctx, method)
	} else {
		st, err = cl.ClientStreaming(ctx, method)
	}
	if err != nil {
		return callError(err)
	}
	defer st.Close()
	sent := make(chan error, 1)
	go func() {
		err := sendItems(st, item, stdin, raw)
		sent <- err // before Close: Recv's error below then finds it
		if err != nil {
			st.Close()
		}
	}()
	if !bidi {
		if err := <-sent; err != nil {
			return err
		}
		resp, err := st.CloseAndRecvRaw()
		if err != nil {
			return callError(err)
		}
		return printResp(out, resp, raw)
	}
	for {
		resp, err := st.RecvRaw()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// A bad line ends the call (Close): say which line, not "canceled".
			select {
			case serr := <-sent:
				if serr != nil {
					return serr
				}
			default:
			}
			return callError(err)
		}
		if err := printResp(out, resp, raw); err != nil {
			return err
		}
	}
	select {
	case err := <-sent:
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
	default: // the server ended the call before stdin did
	}
	return nil
}

// sendItems sends item, or each line of stdin, then half-closes the call. A
// line that is not JSON (without raw) is a usage error; the caller then ends
// the call.
func sendItems(st *rpc.BidiStream, item []byte, stdin io.Reader, raw bool) error {
	if item != nil {
		if err := st.SendRaw(item); err != nil {
			return err
		}
		return st.CloseSend()
	}
	sc := bufio.NewScanner(stdin)
	sc.Buffer(make([]byte, 0, 64<<10), maxItemLine)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if !raw {
			if len(trimSpace(line)) == 0 {
				continue
			}
			if !json.Valid(line) {
				return usage(fmt.Errorf("stdin line %d is not valid JSON (%.40q): each line is one request item, a JSON value; use --raw for bytes", n, line))
			}
		}
		if err := st.SendRaw(line); err != nil {
			return err // the call ended: its outcome is Recv's
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read stdin: %w (a line may be at most %d bytes)", err, maxItemLine)
	}
	return st.CloseSend()
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
