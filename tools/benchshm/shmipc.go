package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"

	"github.com/cloudwego/shmipc-go"
	"github.com/udskit/udskit/bench"
)

// The shmipc-go rows: each caller holds one shmipc stream and sends
// [u32 length][payload]; the server echoes it on the same stream.
//
//   - shmipc-copy: the copy API: BufferWriter.WriteBytes into shared memory,
//     BufferReader.ReadBytes and a copy out into the caller's buffer.
//   - shmipc-zerocopy: its zero-copy buffers: Reserve shared memory and fill
//     it in place (in slices no larger than its largest buffer slice, as
//     its docs advise), read the answer in place (no copy out).
//
// Both use a memfd (MemMapTypeMemFd: nothing named in /dev/shm) of 64 MiB,
// as udskit's default region, and one session (its default).

const shmipcCap = 64 << 20

// largest is shmipc's largest default buffer slice minus its header:
// Reserve asks for at most this much at a time.
const largest = 128<<10 - 64

func shmipcConfig() *shmipc.Config {
	c := shmipc.DefaultConfig()
	c.ShareMemoryBufferCap = shmipcCap
	c.MemMapType = shmipc.MemMapTypeMemFd
	c.LogOutput = os.Stderr // not stdout: the server process's stdout carries its READY line
	return c
}

func init() {
	for _, zero := range []bool{false, true} {
		name, what := "shmipc-copy", "cloudwego/shmipc-go v0.2.0, copy API (WriteBytes; ReadBytes then a copy out)"
		if zero {
			name, what = "shmipc-zerocopy", "cloudwego/shmipc-go v0.2.0, zero-copy buffers (Reserve and fill in place; read in place)"
		}
		zero := zero
		bench.Register(&bench.Transport{
			Name: name, Network: "unix", Family: "shmipc",
			PerRequest: what + "; one stream per caller, [u32 length][payload] echoed on it; memfd region of 64 MiB, one session",
			Serve:      serveShmipc,
			Dial: func(ctx context.Context, network, address string, conc int) (*bench.Client, error) {
				return dialShmipc(address, conc, zero)
			},
		})
	}
}

func serveShmipc(ctx context.Context, ln net.Listener) error {
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if nc, ok := conn.(interface{ NetConn() net.Conn }); ok {
			conn = nc.NetConn() // uds.Listen's peer-credential wrapper: shmipc needs the *net.UnixConn
		}
		go func() {
			defer conn.Close()
			sess, err := shmipc.Server(conn, shmipcConfig())
			if err != nil {
				fmt.Fprintln(os.Stderr, "shmipc server:", err)
				return
			}
			defer sess.Close()
			for {
				st, err := sess.AcceptStream()
				if err != nil {
					return
				}
				go echoStream(st)
			}
		}()
	}
}

// echoStream answers each [u32 n][n bytes] with the same, copying the
// request into the answer's shared memory (WriteBytes).
func echoStream(st *shmipc.Stream) {
	defer st.Close()
	r, w := st.BufferReader(), st.BufferWriter()
	for {
		hdr, err := r.ReadBytes(4)
		if err != nil {
			return
		}
		n := int(binary.LittleEndian.Uint32(hdr))
		var lb [4]byte
		binary.LittleEndian.PutUint32(lb[:], uint32(n))
		if _, err := w.WriteBytes(lb[:]); err != nil {
			return
		}
		for n > 0 {
			chunk := min(n, largest)
			b, err := r.ReadBytes(chunk)
			if err != nil {
				return
			}
			if _, err := w.WriteBytes(b); err != nil {
				return
			}
			n -= chunk
		}
		r.ReleasePreviousRead()
		if err := st.Flush(false); err != nil {
			return
		}
	}
}

type shmipcCaller struct {
	st   *shmipc.Stream
	zero bool
	buf  []byte
}

func dialShmipc(address string, conc int, zero bool) (*bench.Client, error) {
	conf := shmipc.DefaultSessionManagerConfig()
	conf.Config = shmipcConfig()
	conf.Network, conf.Address = "unix", address
	smgr, err := shmipc.NewSessionManager(conf)
	if err != nil {
		return nil, fmt.Errorf("shmipc session manager: %w", err)
	}
	cl := &bench.Client{}
	var streams []*shmipc.Stream
	for i := 0; i < conc; i++ {
		st, err := smgr.GetStream()
		if err != nil {
			smgr.Close()
			return nil, fmt.Errorf("shmipc stream: %w", err)
		}
		streams = append(streams, st)
		cl.Callers = append(cl.Callers, &shmipcCaller{st: st, zero: zero})
	}
	var once sync.Once
	cl.Close = func() error {
		once.Do(func() {
			for _, st := range streams {
				st.Close()
			}
			smgr.Close()
		})
		return nil
	}
	return cl, nil
}

func (c *shmipcCaller) Call(ctx context.Context, payload []byte) ([]byte, error) {
	r, w := c.st.BufferReader(), c.st.BufferWriter()
	r.ReleasePreviousRead() // the previous answer, read in place, is done with
	var lb [4]byte
	binary.LittleEndian.PutUint32(lb[:], uint32(len(payload)))
	if _, err := w.WriteBytes(lb[:]); err != nil {
		return nil, err
	}
	if c.zero {
		for p := payload; len(p) > 0; {
			chunk := min(len(p), largest)
			b, err := w.Reserve(chunk)
			if err != nil {
				return nil, err
			}
			copy(b, p[:chunk]) // the application builds its payload here
			p = p[chunk:]
		}
	} else if _, err := w.WriteBytes(payload); err != nil {
		return nil, err
	}
	if err := c.st.Flush(false); err != nil {
		return nil, err
	}
	hdr, err := r.ReadBytes(4)
	if err != nil {
		return nil, err
	}
	n := int(binary.LittleEndian.Uint32(hdr))
	if n != len(payload) {
		return nil, errors.New("shmipc: answer of the wrong length")
	}
	if c.zero && n <= largest {
		return r.ReadBytes(n) // in place, released at the next call
	}
	c.buf = c.buf[:0]
	for n > 0 {
		chunk := min(n, largest)
		b, err := r.ReadBytes(chunk)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
		c.buf = append(c.buf, b...)
		n -= chunk
	}
	return c.buf, nil
}
