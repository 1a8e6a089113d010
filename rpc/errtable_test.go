package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testsvc"
	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/uds"
)

// errCondition is one row of protocol/errors.json.
type errCondition struct {
	Name      string   `json:"name"`
	Code      string   `json:"code"`
	Retryable bool     `json:"retryable"`
	Says      []string `json:"says"`
}

// TestErrorTable sets up every condition of protocol/errors.json for real
// and checks what Dial (or a call) reports: the code, whether it is
// retryable, and the words that say what was found. Node and Python check
// the same table.
func TestErrorTable(t *testing.T) {
	b, err := os.ReadFile("../protocol/errors.json")
	if err != nil {
		t.Fatal(err)
	}
	var table struct{ Conditions []errCondition }
	if err := json.Unmarshal(b, &table); err != nil {
		t.Fatal(err)
	}
	dir := testutil.ShortDir(t, 0o700)
	dial := func(addr string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := Dial(ctx, addr, ClientOptions{HandshakeTimeout: 300 * time.Millisecond})
		if err == nil {
			c.Close()
			t.Fatalf("dial %s succeeded", addr)
		}
		return err
	}
	setups := map[string]func(t *testing.T) error{
		"no_socket": func(t *testing.T) error { return dial(filepath.Join(dir, "missing.sock")) },
		"stale_socket": func(t *testing.T) error {
			p := filepath.Join(dir, "stale.sock")
			testutil.StaleSocket(t, p)
			return dial(p)
		},
		"regular_file": func(t *testing.T) error {
			p := filepath.Join(dir, "file.sock")
			os.WriteFile(p, []byte("x"), 0o600)
			return dial(p)
		},
		"directory": func(t *testing.T) error {
			p := filepath.Join(dir, "dir.sock")
			os.Mkdir(p, 0o700)
			return dial(p)
		},
		"silent_server": func(t *testing.T) error {
			return dial(testsvc.StartRedis(t, testsvc.RedisOptions{}).Socket)
		},
		"foreign_server": func(t *testing.T) error {
			p := filepath.Join(dir, "foreign.sock")
			l, err := net.Listen("unix", p)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					c.Read(make([]byte, 64))
					c.Write([]byte("-ERR unknown command 'UDSK'\r\n"))
					c.Close()
				}
			}()
			return dial(p)
		},
		"policy_refused": func(t *testing.T) error {
			p := filepath.Join(dir, "policy.sock")
			ffServer(t, p, func(uds.Cred) error { return uds.ErrPeerRefused })
			return dial(p)
		},
		"server_gone": func(t *testing.T) error {
			p := filepath.Join(dir, "gone.sock")
			s, _ := ffServer(t, p, nil)
			c, err := Dial(context.Background(), p, ClientOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s.Close()
			var last error
			for range 3 { // the first call may meet the broken connection itself
				last = c.Call(context.Background(), "echo", []byte("x"), nil)
				if strings.Contains(errString(last), "fail fast") {
					break
				}
			}
			return last
		},
	}
	for _, cond := range table.Conditions {
		t.Run(cond.Name, func(t *testing.T) {
			setup, ok := setups[cond.Name]
			if !ok {
				t.Fatalf("protocol/errors.json has %q, which this test does not set up", cond.Name)
			}
			err := setup(t)
			if got := CodeOf(err).String(); got != cond.Code {
				t.Errorf("code %s, want %s: %v", got, cond.Code, err)
			}
			if IsRetryable(err) != cond.Retryable {
				t.Errorf("retryable %v, want %v: %v", IsRetryable(err), cond.Retryable, err)
			}
			for _, w := range cond.Says {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message does not say %q: %v", w, err)
				}
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return err.Error()
}
