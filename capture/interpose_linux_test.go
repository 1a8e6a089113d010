package capture

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/pcapng"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// echoServer serves an echo on dir/name and returns the path and the
// socket file's inode.
func echoServer(t *testing.T, dir, name string) (string, uint64) {
	t.Helper()
	path := filepath.Join(dir, name)
	l := testutil.ListenUnix(t, path)
	testutil.Serve(t, l, testutil.Echo)
	return path, testutil.Inode(t, path)
}

func roundTrip(path string, msg []byte) error {
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(msg); err != nil {
		return err
	}
	c.(*net.UnixConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return errors.New("echo mismatch")
	}
	return nil
}

// pcapBuf is a pcapng sink into memory, safe to read after the capture.
type pcapBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *pcapBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *pcapBuf) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf.Bytes()...)
}

func newPcap(t *testing.T) (*pcapBuf, *PcapSink) {
	out := &pcapBuf{}
	w, err := pcapng.NewWriter(out, pcapng.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return out, NewPcapSink(w, PcapOptions{})
}

// streamBytes reassembles, per direction, the payload of every packet.
func streamBytes(t *testing.T, b []byte) (c2s, s2c []byte, comments []string) {
	t.Helper()
	r := pcapng.NewReader(bytes.NewReader(b))
	var serverPort uint16
	for {
		p, err := r.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if p.Comment != "" {
			comments = append(comments, p.Comment)
		}
		ip := p.Data
		hl := 20 + int(ip[32]>>4)*4
		src := uint16(ip[20])<<8 | uint16(ip[21])
		if ip[33]&0x02 != 0 && ip[33]&0x10 == 0 { // SYN: the destination is the server
			serverPort = uint16(ip[22])<<8 | uint16(ip[23])
		}
		if src == serverPort {
			s2c = append(s2c, ip[hl:]...)
		} else {
			c2s = append(c2s, ip[hl:]...)
		}
	}
}

func TestInterposeRelaysRecordsAndRestores(t *testing.T) {
	dir := testutil.ShortDir(t, 0o755)
	path, ino := echoServer(t, dir, "app.sock")
	os.Chmod(path, 0o660)
	out, sink := newPcap(t)
	ip, err := Interpose(context.Background(), path, InterposeOptions{Sink: sink, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	if testutil.Inode(t, path) == ino {
		t.Fatal("the path still is the original socket")
	}
	if fi, _ := os.Lstat(path); fi.Mode().Perm() != 0o660 {
		t.Fatalf("relay socket mode %v, want the original's 0660", fi.Mode().Perm())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ip.Serve(ctx) }()
	msg := []byte("hello through the relay\n")
	if err := roundTrip(path, msg); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 300_000/16)
	if err := roundTrip(path, big); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := testutil.Inode(t, path); got != ino {
		t.Fatalf("inode after restore %d, want the original %d", got, ino)
	}
	for _, suffix := range []string{AsideSuffix, TempSuffix, StateSuffix} {
		if _, err := os.Lstat(path + suffix); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind: %v", path+suffix, err)
		}
	}
	if err := roundTrip(path, msg); err != nil {
		t.Fatalf("after restore: %v", err)
	}
	if s := ip.Stats(); s.Accepted != 2 || s.Ended != 2 || s.Failed != 0 {
		t.Fatalf("stats %+v", s)
	}
	c2s, s2c, comments := streamBytes(t, out.Bytes())
	want := append(append([]byte(nil), msg...), big...)
	if !bytes.Equal(c2s, want) || !bytes.Equal(s2c, want) {
		t.Fatalf("recorded %d/%d bytes, want %d each way", len(c2s), len(s2c), len(want))
	}
	if len(comments) == 0 || !strings.Contains(comments[0], "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("connection comment %q does not name the client pid", comments)
	}
}
