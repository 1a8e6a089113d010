package uds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

// The test binary doubles as a helper process (another pid, or uid nobody
// via testutil.NobodyCmd). Linux-only test files add their helpers in init.
var helpers = map[string]testutil.HelperFunc{
	"dial":        helperDial,
	"listen":      helperListen,
	"swapsymlink": helperSwapSymlink,
}

func TestMain(m *testing.M) { testutil.Main(m, helpers) }

// helperResult is what the dial helper prints as JSON.
type helperResult struct {
	UID   int    `json:"uid"`
	Err   string `json:"err,omitempty"`
	Errno string `json:"errno,omitempty"`
	Read  string `json:"read"`
}

func helperDial(addr string) int {
	res := helperResult{UID: os.Getuid()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, DialOptions{})
	if err != nil {
		res.Err = err.Error()
		for _, e := range []syscall.Errno{syscall.EACCES, syscall.ENOENT, syscall.ECONNREFUSED} {
			if errors.Is(err, e) {
				res.Errno = e.Error()
			}
		}
	} else {
		c.Write([]byte("ping\n"))
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		b, err := io.ReadAll(c)
		res.Read = string(b)
		if err != nil {
			res.Err = err.Error()
		}
		c.Close()
	}
	return testutil.PrintJSON(res)
}

func helperListen(addr string) int {
	l, err := Listen(context.Background(), addr, ListenOptions{})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	testutil.Ready() // returns when the parent closes stdin
	return 0
}

// startListenHelper starts a child process listening on addr and returns it
// once it is ready; t.Cleanup stops it.
func startListenHelper(t *testing.T, addr string) *testutil.Child {
	t.Helper()
	return testutil.StartHelper(t, testutil.HelperCmd(t, "listen", addr))
}

// dialAsNobody runs the dial helper on addr as uid nobody (skipping the test
// when that is not possible here) and returns what it saw.
func dialAsNobody(t *testing.T, addr string) helperResult {
	t.Helper()
	var res helperResult
	testutil.RunJSON(t, testutil.NobodyCmd(t, "dial", addr), &res)
	if res.UID != testutil.NobodyUID {
		t.Fatalf("helper ran as uid %d, want %d", res.UID, testutil.NobodyUID)
	}
	return res
}
