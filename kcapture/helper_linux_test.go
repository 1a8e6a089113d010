package kcapture

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/udskit/udskit/internal/testutil"
)

// The tests' peers run as child processes (this test binary re-executed,
// testutil.HelperCmd) because the capture never records its own process.
func TestMain(m *testing.M) {
	helpers := map[string]testutil.HelperFunc{}
	for _, mode := range []string{"echo-server", "sink-server", "client", "blast", "blast64", "blast64-paced", "vec-client", "seq-server", "seq-client", "redial", "pair-parent", "pair-child", "one-thread", "one-thread-file", "one-thread-pipe"} {
		helpers[mode] = func(path string) int {
			if err := runHelper(mode, path); err != nil {
				fmt.Fprintln(os.Stderr, "helper:", err)
				return 1
			}
			return 0
		}
	}
	testutil.Main(m, helpers)
}

// runHelper is the child process side.
//
//	echo-server PATH: accept connections, echo every read back.
//	sink-server PATH: accept connections, read and discard.
//	client PATH: connect, print "ready", then for each stdin line write it
//	  and print the echo.
//	blast PATH: connect, print "ready", wait for a stdin line, write 1 MiB in
//	  one write and then 10,000 writes of "%05d\n", print "done".
//	blast64 PATH: the same with blast64Writes (64 KiB and 8 KiB writes).
//	blast64-paced PATH: blast64Writes twice, 2 ms apart.
func runHelper(mode, path string) error {
	switch mode {
	case "echo-server", "sink-server":
		ln, err := net.Listen("unix", path)
		if err != nil {
			return err
		}
		fmt.Println("ready")
		for {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			go func() {
				defer c.Close()
				if mode == "sink-server" {
					io.Copy(io.Discard, c)
					return
				}
				io.Copy(c, c)
			}()
		}
	case "client":
		c, err := net.Dial("unix", path)
		if err != nil {
			return err
		}
		fmt.Println("ready")
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			line := in.Text() + "\n"
			if _, err := c.Write([]byte(line)); err != nil {
				return err
			}
			buf := make([]byte, len(line))
			if _, err := io.ReadFull(c, buf); err != nil {
				return err
			}
			fmt.Print(string(buf))
		}
		return nil
	case "redial":
		// redial PATH: a raw-fd client: each stdin line is written and its
		// echo printed; a line "@OTHER" closes the connection and connects
		// to OTHER on the same fd number (dup2), as a program reusing fds.
		dial := func(p string) (int, error) {
			fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
			if err != nil {
				return -1, err
			}
			return fd, syscall.Connect(fd, &syscall.SockaddrUnix{Name: p})
		}
		fd, err := dial(path)
		if err != nil {
			return err
		}
		fmt.Println("ready")
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			if other, ok := strings.CutPrefix(in.Text(), "@"); ok {
				nfd, err := dial(other)
				if err != nil {
					return err
				}
				if err := syscall.Dup2(nfd, fd); err != nil {
					return err
				}
				syscall.Close(nfd)
				fmt.Println("redialed")
				continue
			}
			line := []byte(in.Text() + "\n")
			if _, err := syscall.Write(fd, line); err != nil {
				return err
			}
			buf := make([]byte, len(line))
			for got := 0; got < len(buf); {
				n, err := syscall.Read(fd, buf[got:])
				if err != nil || n == 0 {
					return fmt.Errorf("read: %v", err)
				}
				got += n
			}
			fmt.Print(string(buf))
		}
		return nil
	case "pair-parent":
		// pair-parent: a socketpair whose other end goes to a child process
		// (pair-child, fd 3), as fork does: SO_PEERCRED names this process
		// at both ends. Each stdin line goes to the child, which writes it
		// into the pair; this process reads it back and prints it.
		fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
		if err != nil {
			return err
		}
		exe, _ := os.Executable()
		child := exec.Command(exe, "-test.run=^$")
		child.Env = append(os.Environ(), "UDSKIT_TEST_HELPER=pair-child")
		child.ExtraFiles = []*os.File{os.NewFile(uintptr(fds[1]), "pair")}
		child.Stderr = os.Stderr
		toChild, err := child.StdinPipe()
		if err != nil {
			return err
		}
		if err := child.Start(); err != nil {
			return err
		}
		syscall.Close(fds[1])
		fmt.Println("ready")
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			line := in.Text() + "\n"
			io.WriteString(toChild, line)
			buf := make([]byte, len(line))
			for got := 0; got < len(buf); {
				n, err := syscall.Read(fds[0], buf[got:])
				if err != nil || n == 0 {
					return fmt.Errorf("read: %v", err)
				}
				got += n
			}
			fmt.Print(string(buf))
		}
		toChild.Close()
		return child.Wait()
	case "one-thread":
		// one-thread: everything on one OS thread, whose id it prints
		// ("tid N") after "ready": then it waits in read(0) for a stdin
		// line, sends "real" through a seqpacket socketpair, reads it from
		// the other end, prints "done" and waits for stdin's end.
		runtime.LockOSThread()
		fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET, 0)
		if err != nil {
			return err
		}
		fmt.Printf("ready\ntid %d\n", syscall.Gettid())
		buf := make([]byte, 64)
		if _, err := syscall.Read(0, buf); err != nil {
			return err
		}
		return sendRealThenWait(fds, buf)
	case "one-thread-file":
		// one-thread-file: as one-thread, but it waits for stdin in
		// ppoll (not a traced syscall) after printing "tid N fd M" (M: an
		// fd open on /dev/null), then writes "not-sock" to /dev/null (a
		// write on an fd that is no socket: recorded by nothing), and
		// only then reads stdin's line, sends "real" through the
		// socketpair and prints "done".
		runtime.LockOSThread()
		fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET, 0)
		if err != nil {
			return err
		}
		null, err := syscall.Open(os.DevNull, syscall.O_WRONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		fmt.Printf("ready\ntid %d fd %d\n", syscall.Gettid(), null)
		pfd := []unix.PollFd{{Fd: 0, Events: unix.POLLIN}}
		for {
			n, err := unix.Ppoll(pfd, nil, nil)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return err
			}
			if n > 0 {
				break
			}
		}
		if _, err := syscall.Write(null, []byte("not-sock")); err != nil {
			return err
		}
		buf := make([]byte, 64)
		if _, err := syscall.Read(0, buf); err != nil {
			return err
		}
		return sendRealThenWait(fds, buf)
	case "one-thread-pipe":
		// one-thread-pipe: as one-thread, but it prints "tid N pipe R" (R:
		// the read end of a pipe nobody reads), waits for a stdin line,
		// writes pipeWrite bytes to the pipe in one write(2) (blocking
		// until the test, reading the pipe through /proc, has read them
		// all), then waits for another stdin line, sends "real" through
		// the socketpair and prints "done".
		runtime.LockOSThread()
		fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET, 0)
		if err != nil {
			return err
		}
		var p [2]int
		if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
			return err
		}
		fmt.Printf("ready\ntid %d pipe %d\n", syscall.Gettid(), p[0])
		buf := make([]byte, 64)
		if _, err := syscall.Read(0, buf); err != nil {
			return err
		}
		if n, err := syscall.Write(p[1], make([]byte, pipeWrite)); n != pipeWrite || err != nil {
			return fmt.Errorf("pipe write: %d of %d bytes, %v", n, pipeWrite, err)
		}
		if _, err := syscall.Read(0, buf); err != nil {
			return err
		}
		return sendRealThenWait(fds, buf)
	case "pair-child":
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			if _, err := syscall.Write(3, []byte(in.Text()+"\n")); err != nil {
				return err
			}
		}
		return nil
	case "blast":
		c, err := net.Dial("unix", path)
		if err != nil {
			return err
		}
		fmt.Println("ready")
		bufio.NewReader(os.Stdin).ReadString('\n')
		if _, err := c.Write(blastBig()); err != nil {
			return err
		}
		for i := range blastSmall {
			if _, err := fmt.Fprintf(c, "%05d\n", i); err != nil {
				return err
			}
		}
		fmt.Println("done")
		bufio.NewReader(os.Stdin).ReadString('\n')
		return nil
	case "blast64", "blast64-paced":
		// 64 KiB and 8 KiB writes: each one ring-buffer record, written
		// from the ring in place; paced: 2 ms apart, twice over.
		c, err := net.Dial("unix", path)
		if err != nil {
			return err
		}
		fmt.Println("ready")
		bufio.NewReader(os.Stdin).ReadString('\n')
		writes := blast64Writes()
		if mode == "blast64-paced" {
			writes = append(writes, writes...)
		}
		for _, w := range writes {
			if _, err := c.Write(w); err != nil {
				return err
			}
			if mode == "blast64-paced" {
				time.Sleep(2 * time.Millisecond)
			}
		}
		fmt.Println("done")
		bufio.NewReader(os.Stdin).ReadString('\n')
		return nil
	case "vec-client":
		// writev of three iovecs (one empty), then readv of the echo
		// into two buffers.
		c, err := net.Dial("unix", path)
		if err != nil {
			return err
		}
		f, err := c.(*net.UnixConn).File()
		if err != nil {
			return err
		}
		fd := int(f.Fd()) // File sets the fd blocking
		fmt.Println("ready")
		bufio.NewReader(os.Stdin).ReadString('\n')
		if _, err := unix.Writev(fd, [][]byte{[]byte("ab"), {}, []byte("cde")}); err != nil {
			return err
		}
		a, b := make([]byte, 2), make([]byte, 3)
		for got := 0; got < 5; {
			n, err := unix.Readv(fd, [][]byte{a[min(got, 2):], b[max(got-2, 0):]})
			if err != nil || n == 0 {
				return fmt.Errorf("readv: %d %v", n, err)
			}
			got += n
		}
		fmt.Println(string(a) + string(b))
		bufio.NewReader(os.Stdin).ReadString('\n')
		return nil
	case "seq-server":
		ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
		if err != nil {
			return err
		}
		fmt.Println("ready")
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return err
			}
			go func() {
				defer c.Close()
				buf, oob := make([]byte, 4096), make([]byte, 256)
				for {
					n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
					if err != nil {
						return
					}
					closeRights(oob[:oobn])
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	case "seq-client":
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
		if err != nil {
			return err
		}
		fmt.Println("ready")
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			// One stdin line: messages separated by spaces, sent back to
			// back; one starting with "fd:" carries stdin's fd (SCM_RIGHTS).
			msgs := strings.Fields(in.Text())
			for _, m := range msgs {
				var oob []byte
				if strings.HasPrefix(m, "fd:") {
					oob = syscall.UnixRights(int(os.Stdin.Fd()))
				}
				if _, _, err := c.WriteMsgUnix([]byte(m), oob, nil); err != nil {
					return err
				}
			}
			var got []string
			buf := make([]byte, 4096)
			for range msgs {
				n, err := c.Read(buf)
				if err != nil {
					return err
				}
				got = append(got, string(buf[:n]))
			}
			fmt.Println(strings.Join(got, " "))
		}
		return nil
	}
	return fmt.Errorf("unknown helper mode %q", mode)
}

const blastSmall = 10000

func blastBig() []byte {
	b := make([]byte, 1<<20)
	for i := range b {
		b[i] = byte('a' + i%26)
	}
	return b
}

func blast64Writes() [][]byte {
	var out [][]byte
	for i := range 48 {
		size := 64 << 10
		if i%3 == 2 {
			size = 8 << 10
		}
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(i*7 + j*13)
		}
		out = append(out, b)
	}
	return out
}

func blastExpected() []byte {
	b := blastBig()
	for i := range blastSmall {
		b = fmt.Appendf(b, "%05d\n", i)
	}
	return b
}

// helper is a running child process.
type helper struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// startHelper starts a child in mode on path and waits for its "ready".
func startHelper(t *testing.T, mode, path string) *helper {
	t.Helper()
	cmd := testutil.HelperCmd(t, mode, path)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, in: in, out: bufio.NewReader(outp)}
	t.Cleanup(func() {
		in.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	h.expect(t, "ready")
	return h
}

func (h *helper) pid() int { return h.cmd.Process.Pid }

// expect reads one line and checks it.
func (h *helper) expect(t *testing.T, want string) {
	t.Helper()
	line, err := h.readLine(30 * time.Second)
	if err != nil || line != want {
		t.Fatalf("helper %d: got %q, %v; want %q", h.pid(), line, err, want)
	}
}

func (h *helper) readLine(timeout time.Duration) (string, error) {
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := h.out.ReadString('\n')
		ch <- res{strings.TrimSuffix(s, "\n"), err}
	}()
	select {
	case r := <-ch:
		return r.s, r.err
	case <-time.After(timeout):
		return "", errors.New("timeout")
	}
}

// say writes a line to the helper's stdin.
func (h *helper) say(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(h.in, line+"\n"); err != nil {
		t.Fatal(err)
	}
}

// running is a capture in progress.
type running struct {
	cap    *Capture
	cancel context.CancelFunc
	done   chan struct{}
	stats  *Stats
	err    error
}

// startCapture opens a capture (skipping the test, with the reason, only
// where the kernel refuses everything) and runs it into sink.
func startCapture(t *testing.T, opts Options, sink Sink) *running {
	t.Helper()
	if r := Check(true); !r.OK {
		skipOrFail(t, r)
	}
	opts.Logf = t.Logf
	c, err := Open(opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cap: c, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.stats, r.err = c.Run(ctx, sink, nil)
	}()
	t.Cleanup(func() { r.stop(t); c.Close() })
	return r
}

// stop ends the capture and waits for Run.
func (r *running) stop(t *testing.T) *Stats {
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		t.Fatal("capture did not stop")
	}
	if r.err != nil {
		t.Errorf("Run: %v", r.err)
	}
	return r.stats
}

// skipOrFail skips where the kernel cannot run the capture at all. On this
// project's machines (root, BTF, tracefs) that must not happen: set
// UDSKIT_REQUIRE_KCAPTURE=1 (CI does) to make it a failure.
func skipOrFail(t *testing.T, r *Report) {
	t.Helper()
	msg := fmt.Sprintf("kernel capture unavailable here: %v", r.Problems)
	if v, _ := strconv.ParseBool(os.Getenv("UDSKIT_REQUIRE_KCAPTURE")); v {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// closeRights closes the fds a control message brought.
func closeRights(oob []byte) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	for _, m := range msgs {
		fds, err := syscall.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			syscall.Close(fd)
		}
	}
}

// sendRealThenWait ends the one-thread helpers: it sends "real" through the
// socketpair fds, reads it back, prints "done" and waits for stdin's end.
// pipeWrite is the one-thread-pipe helper's write: larger than a pipe holds.
const pipeWrite = 1 << 20

func sendRealThenWait(fds [2]int, buf []byte) error {
	if _, err := syscall.Write(fds[0], []byte("real")); err != nil {
		return err
	}
	if n, err := syscall.Read(fds[1], buf); err != nil || string(buf[:n]) != "real" {
		return fmt.Errorf("socketpair read %q: %v", buf[:max(n, 0)], err)
	}
	fmt.Println("done")
	for {
		if n, err := syscall.Read(0, buf); n <= 0 || err != nil {
			return nil
		}
	}
}
