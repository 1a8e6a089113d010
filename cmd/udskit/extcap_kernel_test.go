//go:build linux

package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

// In kernel mode the extcap records from the moment its pcapng header
// reaches Wireshark: Wireshark starts the capture, and -a duration:N, when
// the header arrives. The header used to go out before the BPF programs
// were loaded, which took 3.5-8.7 s for the -race binary on a loaded
// machine: TestExtcapTsharkKernel's 4 s capture then recorded nothing
// ("no pgsql.query decoded", tshark's "0 packets captured"). Here a
// message is exchanged as soon as the header is read, and must be in the
// capture.
func TestExtcapKernelRecordsOnceStarted(t *testing.T) {
	needKernelCapture(t)
	dir := testutil.ShortDir(t, 0o700)
	sock := filepath.Join(dir, "app.sock")
	testutil.Serve(t, testutil.ListenUnix(t, sock), testutil.Echo)
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := scCLI(ctx, "extcap", "--capture", "--extcap-interface", "udskit", "--fifo", fifo, "--socket", sock, "--mode", "kernel")
	errb := &testutil.Buffer{}
	cmd.Stderr = errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(fifo) // waits for the extcap to open it
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	head := make([]byte, 4)
	if _, err := io.ReadFull(r, head); err != nil || !bytes.Equal(head, []byte{0x0a, 0x0d, 0x0d, 0x0a}) {
		t.Fatalf("no pcapng section header from the extcap: %x %v\n%s", head, err, errb)
	}
	rest := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(r); rest <- b }()
	const payload = "sent-as-the-header-arrived"
	c := testutil.DialUnix(t, sock)
	c.Write([]byte(payload))
	io.ReadFull(c, make([]byte, len(payload)))
	c.Close()
	time.Sleep(100 * time.Millisecond) // past the capture's 20 ms ordering window
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("udskit extcap: %v\n%s", err, errb)
	}
	if got := <-rest; bytes.Count(got, []byte(payload)) != 2 {
		t.Fatalf("the message sent once the header had arrived is recorded %d times, want 2 (request and echo); stderr: %s", bytes.Count(got, []byte(payload)), errb)
	}
}
