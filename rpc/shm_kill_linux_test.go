package rpc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/uds"
)

// The kill -9 tests run the other side in a real process: this test binary
// again, in TestShmHelperProcess.

const shmHelperEnv = "UDSKIT_SHM_HELPER"

// TestShmHelperProcess is not a test: it is the far side of the kill -9
// tests when run with UDSKIT_SHM_HELPER set (server or client).
func TestShmHelperProcess(t *testing.T) {
	role, addr := os.Getenv(shmHelperEnv), os.Getenv("UDSKIT_SHM_ADDR")
	switch role {
	case "":
		return // an ordinary test run: nothing to do
	case "server":
		s := echoServer()
		s.HandleRaw("slow", func(ctx context.Context, req, dst []byte) ([]byte, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
		registerSum(s) // (TestShmStreamsServerKilled)
		l, err := listenUnix(addr)
		if err != nil {
			fmt.Println("listen:", err)
			os.Exit(2)
		}
		fmt.Println("ready")
		s.Serve(l)
	case "client", "slotclient":
		opts := ClientOptions{Conns: 1, LargeConns: 1}
		if role == "slotclient" { // (TestShmCallsClientKilled: the call goes through a call slot)
			opts.ShmConns, opts.ShmCalls = 1, true
		}
		c, err := Dial(context.Background(), addr, opts)
		if err != nil {
			fmt.Println("dial:", err)
			os.Exit(2)
		}
		if c.ShmStats().Conns != 1 {
			fmt.Println("no shared memory")
			os.Exit(2)
		}
		fmt.Println("calling")
		if role == "slotclient" { // a second call at once (TestShmCallsClientKilled)
			go c.CallRaw(context.Background(), "slow", pattern(1<<20, 2), nil)
		}
		c.CallRaw(context.Background(), "slow", pattern(1<<20, 1), nil)
	}
	os.Exit(0)
}

func startHelper(t *testing.T, role, addr, want string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestShmHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), shmHelperEnv+"="+role, "UDSKIT_SHM_ADDR="+addr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case l := <-line:
		if l != want {
			t.Fatalf("%s helper said %q, want %q", role, l, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s helper did not start", role)
	}
	return cmd
}

// shmTraces counts this process's memfd mappings and descriptors of udskit
// regions, and lists the udskit entries of /dev/shm (only those: other
// processes on the machine, PostgreSQL started by other tests among them,
// add and remove their own segments there meanwhile).
func shmTraces(t *testing.T) (maps, fds int, devShm string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	maps = strings.Count(string(b), "memfd:udskit-shm")
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.Contains(l, "memfd:udskit-shm") {
			fds++
		}
	}
	dev, _ := os.ReadDir("/dev/shm")
	var names []string
	for _, e := range dev {
		if strings.Contains(strings.ToLower(e.Name()), "udskit") {
			names = append(names, e.Name())
		}
	}
	return maps, fds, strings.Join(names, ",")
}

func waitNoTraces(t *testing.T, devBefore string) {
	t.Helper()
	var maps, fds int
	var dev string
	deadline := time.Now().Add(10 * time.Second)
	for {
		maps, fds, dev = shmTraces(t)
		if maps == 0 && fds == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left behind: %d mappings and %d descriptors of shared regions", maps, fds)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if dev != devBefore {
		t.Fatalf("/dev/shm changed: %q, before %q", dev, devBefore)
	}
}

// TestShmServerKilled: kill -9 of the server mid-call fails the client's
// call at once, and the client keeps no mapping or descriptor of the region.
func TestShmServerKilled(t *testing.T) {
	_, _, devBefore := shmTraces(t)
	addr := "unix:" + filepath.Join(t.TempDir(), "k.sock")
	srv := startHelper(t, "server", addr, "ready")
	c := dialOpts(t, addr, ClientOptions{Conns: 1, LargeConns: 1, NoReconnect: true})
	if c.ShmStats().Conns != 1 {
		t.Fatal("no shared memory with the helper server")
	}
	if maps, _, _ := shmTraces(t); maps == 0 {
		t.Fatal("the region's mapping is not visible in /proc/self/maps: the leak check would prove nothing")
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.CallRaw(context.Background(), "slow", pattern(1<<20, 2), nil)
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond) // the call is in flight, its handler waiting
	killServerMidCall(t, srv, errc)
	c.Close()
	waitNoTraces(t, devBefore)
}

// killedClient starts a server whose "slow" handler waits for its call's
// end, and a helper process of role calling it; it returns once n of the
// helper's calls are in their handlers. kill -9s the helper and checks
// that each of the n handlers is canceled.
func killedClient(t *testing.T, role string, n int) (s *Server, addr string, kill func()) {
	t.Helper()
	s = echoServer()
	entered, ended := make(chan struct{}, n), make(chan struct{}, n)
	s.HandleRaw("slow", func(ctx context.Context, req, dst []byte) ([]byte, error) {
		entered <- struct{}{}
		<-ctx.Done()
		ended <- struct{}{}
		return nil, ctx.Err()
	})
	addr = startServer(t, s)
	cli := startHelper(t, role, addr, "calling")
	for range n {
		select {
		case <-entered:
		case <-time.After(20 * time.Second):
			t.Fatal("the helper's calls did not arrive")
		}
	}
	return s, addr, func() {
		t.Helper()
		cli.Process.Signal(syscall.SIGKILL)
		for range n {
			select {
			case <-ended:
			case <-time.After(10 * time.Second):
				t.Fatal("a handler was not canceled after the client was killed")
			}
		}
	}
}

// TestShmClientKilled: kill -9 of the client mid-call ends its handler at
// once, and the server unmaps the region (no mapping, no descriptor left).
func TestShmClientKilled(t *testing.T) {
	_, _, devBefore := shmTraces(t)
	s, _, kill := killedClient(t, "client", 1)
	if st := s.ShmStats(); st.Conns != 1 || st.Received != 1 {
		t.Fatalf("server shm %+v, want the 1 MiB request through the region", st)
	}
	kill()
	waitFor(t, "the server to drop the connection", func() bool { return s.ShmStats().Conns == 0 })
	waitNoTraces(t, devBefore)
}

// TestShmConnectCyclesNoLeak: 10,000 connect/negotiate/close cycles leave
// no descriptor and no mapping behind on either side (same process).
func TestShmConnectCyclesNoLeak(t *testing.T) {
	s := echoServer()
	addr := startServer(t, s)
	countFDs := func() int {
		ents, _ := os.ReadDir("/proc/self/fd")
		return len(ents)
	}
	countMaps := func() int {
		b, _ := os.ReadFile("/proc/self/maps")
		return strings.Count(string(b), "\n")
	}
	warm := dialOpts(t, addr, ClientOptions{Conns: 1})
	warm.CallRaw(context.Background(), "echo", pattern(64<<10, 1), nil)
	warm.Close()
	waitFor(t, "the warm-up connection to close", func() bool { return s.ShmStats().Conns == 0 })
	fd0, maps0 := countFDs(), countMaps()
	ctx := context.Background()
	for i := 0; i < 10000; i++ {
		c, err := Dial(ctx, addr, ClientOptions{Conns: 1, LargeConns: 1})
		if err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		if c.ShmStats().Conns != 1 {
			t.Fatalf("cycle %d: no shared memory", i)
		}
		c.Close()
	}
	waitFor(t, "the server to close every connection", func() bool { return s.ShmStats().Conns == 0 })
	var fd1, maps1, regions int
	deadline := time.Now().Add(10 * time.Second)
	for {
		fd1, maps1 = countFDs(), countMaps()
		regions, _, _ = shmTraces(t)
		if (fd1 <= fd0 && regions == 0 && maps1 <= maps0+100) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The Go heap may map a few more arenas; a leak would be thousands.
	if fd1 > fd0 || regions != 0 || maps1 > maps0+100 {
		t.Fatalf("after 10,000 cycles: %d fds (before %d), %d mappings (before %d), %d region mappings", fd1, fd0, maps1, maps0, regions)
	}
	t.Logf("fds %d→%d, mappings %d→%d", fd0, fd1, maps0, maps1)
}

func listenUnix(addr string) (net.Listener, error) {
	return uds.Listen(context.Background(), addr, uds.ListenOptions{})
}

// killServerMidCall kills the server process with SIGKILL while a call is in
// flight and checks that the call (its result on errc) fails with
// Unavailable within 5 s of the kill.
func killServerMidCall(t *testing.T, srv *exec.Cmd, errc <-chan error) {
	t.Helper()
	killed := time.Now()
	srv.Process.Signal(syscall.SIGKILL)
	select {
	case err := <-errc:
		var e *Error
		if !errors.As(err, &e) || e.Code != Unavailable {
			t.Fatalf("call failed with %v, want unavailable", err)
		}
		if d := time.Since(killed); d > 5*time.Second {
			t.Fatalf("the call failed %v after the kill", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not fail after the server was killed")
	}
}
