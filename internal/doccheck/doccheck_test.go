package doccheck

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/socklist"
	"github.com/udskit/udskit/uds"
)

// moduleRoot is the directory holding this module's go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

func goTool() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(p) {
		return p
	}
	return "go"
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// TestDocExamples: every ```go block of README.md and docs/*.md compiles as
// a user's program would, and runs as its fence line says (see doc.go).
func TestDocExamples(t *testing.T) {
	root := moduleRoot(t)
	files, err := DocFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []Block
	for _, f := range files {
		bs, err := Extract(root, f)
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, bs...)
	}
	if len(blocks) == 0 {
		t.Fatal("no go blocks found: is the module root right?")
	}

	// One temp module, one directory per complete block, built in one go.
	mod := t.TempDir()
	gomod := fmt.Sprintf("module doccheck.example\n\ngo 1.26.0\n\nrequire github.com/udskit/udskit v0.0.0-00010101000000-000000000000\n\nreplace github.com/udskit/udskit => %s\n", root)
	must(t, os.WriteFile(filepath.Join(mod, "go.mod"), []byte(gomod), 0o644))
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	must(t, err)
	must(t, os.WriteFile(filepath.Join(mod, "go.sum"), sum, 0o644))
	dirOf := map[string]Block{}
	var fragments, built int
	for i, b := range blocks {
		if b.Mode == "fragment" {
			if err := ParseFragment(b); err != nil {
				t.Error(err)
			}
			fragments++
			continue
		}
		d := fmt.Sprintf("b%02d", i)
		must(t, os.MkdirAll(filepath.Join(mod, d), 0o755))
		must(t, os.WriteFile(filepath.Join(mod, d, "example.go"), []byte(b.Code), 0o644))
		dirOf[d] = b
		built++
	}
	bin := filepath.Join(mod, "bin")
	must(t, os.MkdirAll(bin, 0o755))
	env := append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off", "GOTOOLCHAIN=local")
	for _, args := range [][]string{{"vet", "./..."}, {"build", "-o", bin + "/", "./..."}} {
		cmd := exec.Command(goTool(), args...)
		cmd.Dir, cmd.Env = mod, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s on the doc examples:\n%s", args[0], mapPositions(string(out), dirOf))
		}
	}

	ran := 0
	for d, b := range dirOf {
		if b.Package != "main" || b.Mode == "build" {
			continue
		}
		exe := filepath.Join(bin, d)
		t.Run(fmt.Sprintf("%s:%d", b.File, b.Line-1), func(t *testing.T) {
			if err := runBlock(t, exe, b); err != nil {
				t.Errorf("%s: the example (%s mode) %v", b.Pos(1), b.Mode, err)
			}
		})
		ran++
	}
	t.Logf("%d go blocks: %d built, %d run, %d fragments parsed", len(blocks), built, ran, fragments)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

var posRE = regexp.MustCompile(`(?:\./)?(b\d\d)/example\.go:(\d+)(:\d+)?`)

// mapPositions rewrites bNN/example.go:L:C in the go tool's output into the
// Markdown file and line the code came from.
func mapPositions(out string, dirOf map[string]Block) string {
	return posRE.ReplaceAllStringFunc(out, func(m string) string {
		s := posRE.FindStringSubmatch(m)
		b, ok := dirOf[s[1]]
		if !ok {
			return m
		}
		var l int
		fmt.Sscan(s[2], &l)
		return b.Pos(l) + s[3]
	})
}

// runBlock runs one example program as its fence line says.
func runBlock(t *testing.T, exe string, b Block) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if b.Mode == "listen" {
		l, err := uds.Listen(ctx, b.Addr, uds.ListenOptions{})
		if err != nil {
			return fmt.Errorf("needs a listener on %s: %v", b.Addr, err)
		}
		defer l.Close()
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				defer c.Close()
			}
		}()
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Dir = t.TempDir()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	fail := func(format string, args ...any) error {
		cmd.Process.Kill()
		<-done
		return fmt.Errorf(format+"\noutput:\n%s", append(args, out.String())...)
	}
	switch b.Mode {
	case "run", "listen":
		if err := <-done; err != nil {
			return fmt.Errorf("failed: %v\noutput:\n%s", err, out.String())
		}
		return nil
	}
	// serve and drain: wait until the address accepts.
	var c net.Conn
	for deadline := time.Now().Add(15 * time.Second); ; {
		var err error
		if c, err = uds.Dial(ctx, b.Addr, uds.DialOptions{}); err == nil {
			break
		}
		select {
		case err := <-done:
			done <- err
			return fail("exited (%v) before %s accepted", err, b.Addr)
		default:
		}
		if time.Now().After(deadline) {
			return fail("never accepted on %s: %v", b.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer c.Close()
	if b.Mode == "serve" {
		cmd.Process.Kill()
		<-done
		return nil
	}
	// drain: SIGTERM with a connection open; it must wait for it. First make
	// sure the server accepted it: a connection still in the backlog is
	// dropped when the listener closes, and there would be nothing to drain.
	waitAccepted(ctx, b.Addr)
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		return fmt.Errorf("exited (%v) at SIGTERM although a client was still connected: the drain was cut off\noutput:\n%s", err, out.String())
	case <-time.After(300 * time.Millisecond):
	}
	c.Close()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("exited with %v after draining\noutput:\n%s", err, out.String())
		}
		return nil
	case <-time.After(10 * time.Second):
		return fail("still running 10s after its last client left")
	}
}

// waitAccepted waits (up to 5 s) until the unix listener at addr has no
// connection waiting for accept(), as sock_diag reports; without sock_diag
// it waits half a second.
func waitAccepted(ctx context.Context, addr string) {
	a, err := uds.ParseAddr(addr)
	if err != nil || a.Kind != uds.Unix {
		time.Sleep(500 * time.Millisecond)
		return
	}
	path, _ := filepath.Abs(a.Name)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		snap, err := socklist.List(ctx, socklist.Options{})
		if err != nil || snap.Source != "sock_diag" {
			time.Sleep(500 * time.Millisecond)
			return
		}
		if ls := snap.ListenersOnPath(path); len(ls) == 1 && ls[0].Listen != nil && ls[0].Listen.Pending == 0 {
			return
		}
	}
}
