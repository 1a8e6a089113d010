package rpc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/uds"
)

func TestMain(m *testing.M) {
	testutil.Main(m, map[string]testutil.HelperFunc{"idle": idleHelper})
}

// idleReport is what the idle helper prints: the CPU time and context
// switches of its whole process (server and clients) over the measured
// window, with every connection open and idle.
type idleReport struct {
	Conns    int   `json:"conns"`
	WindowNS int64 `json:"window_ns"`
	CPUNS    int64 `json:"cpu_ns"`
	Switches int64 `json:"switches"`
	SettleNS int64 `json:"settle_ns"`
}

// idleHelper runs a server and arg clients in one process, makes a few calls
// on each client (so every connection has served inline handlers and its
// client has read responses), lets everything go idle, and measures the
// process's CPU use over a second.
func idleHelper(arg string) int {
	n, err := strconv.Atoi(arg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "idle helper: conns:", err)
		return 2
	}
	dir, err := os.MkdirTemp("", "udskit-idle-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	addr := "unix:" + filepath.Join(dir, "s.sock")
	ctx := context.Background()
	l, err := uds.Listen(ctx, addr, uds.ListenOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	s := echoServer()
	go s.Serve(l)
	defer s.Close()
	clients := make([]*Client, n)
	for i := range clients {
		if clients[i], err = Dial(ctx, addr, ClientOptions{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer clients[i].Close()
	}
	for range 3 {
		for _, c := range clients {
			if _, err := c.CallRaw(ctx, "echo", []byte("x"), nil); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
	}
	const settle = 200 * time.Millisecond
	time.Sleep(settle)
	r0, t0 := rusage(), time.Now()
	time.Sleep(time.Second)
	r1, el := rusage(), time.Since(t0)
	return testutil.PrintJSON(idleReport{
		Conns: n, WindowNS: el.Nanoseconds(), SettleNS: settle.Nanoseconds(),
		CPUNS:    r1.cpu - r0.cpu,
		Switches: r1.switches - r0.switches,
	})
}

type usage struct{ cpu, switches int64 }

func rusage() usage {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return usage{
		cpu:      ru.Utime.Nano() + ru.Stime.Nano(),
		switches: ru.Nvcsw + ru.Nivcsw,
	}
}

// TestIdleServerSleeps: a server and its clients with open but idle
// connections must not wake up every millisecond. The inline-handler
// watchdog used to tick 1000 times a second while any connection was open.
func TestIdleServerSleeps(t *testing.T) {
	var rep idleReport
	testutil.RunJSON(t, testutil.HelperCmd(t, "idle", "20"), &rep)
	t.Logf("20 idle connections (server and clients in one process) over %v: CPU %v, %d context switches",
		time.Duration(rep.WindowNS), time.Duration(rep.CPUNS), rep.Switches)
	if rep.Switches > 200 {
		t.Errorf("%d context switches in a second of idleness; want near 0 (a 1 ms ticker makes ~1000)", rep.Switches)
	}
	if rep.CPUNS > int64(20*time.Millisecond) {
		t.Errorf("idle process used %v of CPU in a second; want well under 20ms", time.Duration(rep.CPUNS))
	}
}
