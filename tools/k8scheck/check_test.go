package k8scheck

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const doc = "../../docs/kubernetes.md"

func pods(t *testing.T) []Block {
	t.Helper()
	md, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	bs := Extract(md)
	if len(bs) < 2 {
		t.Fatalf("%s has %d yaml blocks, want the two recipes", doc, len(bs))
	}
	return bs
}

// TestManifests: every yaml block of docs/kubernetes.md is a Pod that
// decodes strictly and follows the recipe; one uses a native sidecar, one
// does not.
func TestManifests(t *testing.T) {
	native, classic := 0, 0
	for _, b := range pods(t) {
		p, err := DecodePod(b.Text)
		if err != nil {
			t.Errorf("%s:%d: %v", doc, b.Line, err)
			continue
		}
		s, err := Recipe(p)
		if err != nil {
			t.Errorf("%s:%d (pod %s): %v", doc, b.Line, p.Name, err)
			continue
		}
		if s.Native {
			native++
		} else {
			classic++
		}
	}
	if native != 1 || classic != 1 {
		t.Errorf("%d native and %d classic sidecar recipes, want one of each", native, classic)
	}
}

// The checks can fail: a misspelt field, a wrong type, a missing drain
// mode, a grace period shorter than the drain and a socket outside the
// shared volume are each caught.
func TestChecksCatchMistakes(t *testing.T) {
	orig := string(pods(t)[0].Text)
	for _, c := range []struct{ from, to, want string }{
		{"restartPolicy: Always", "restartPolicyy: Always", `unknown field "restartPolicyy"`},
		{"periodSeconds: 1\n", "periodSeconds: one\n", "cannot unmarshal"},
		{"medium: Memory", "medium: Disk", "medium: Memory"},
		{"- --drain=linger\n", "", "--drain=linger"},
		{"terminationGracePeriodSeconds: 30", "terminationGracePeriodSeconds: 20", "terminationGracePeriodSeconds 20"},
		{"- /run/udskit/sidecar.sock\n", "- /tmp/sidecar.sock\n", "not in the shared volume"},
		{"- --mode=0660\n", "- --mode=0666\n", "--mode"},
		{"--allow-uid=10001,10002", "--allow-uid=10002", "--allow-uid"},
		{"      restartPolicy: Always\n", "", "restartPolicy: Always makes it a native sidecar"},
	} {
		if !strings.Contains(orig, c.from) {
			t.Fatalf("the native recipe no longer contains %q", c.from)
		}
		p, err := DecodePod([]byte(strings.Replace(orig, c.from, c.to, 1)))
		if err == nil {
			_, err = Recipe(p)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q -> %q: got %v, want an error mentioning %q", c.from, c.to, err, c.want)
		}
	}
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// udskit returns the udskit binary: $UDSKIT_BIN (make k8scheck builds it),
// else one built from this checkout.
func udskit(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if b := os.Getenv("UDSKIT_BIN"); b != "" {
			binPath = b
			return
		}
		binPath = filepath.Join(os.TempDir(), fmt.Sprintf("k8scheck-udskit-%d", os.Getpid()))
		cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", binPath, "./cmd/udskit")
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/udskit: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// TestSidecarRuns runs each recipe's sidecar here as the manifest says: its
// command and probes with the real udskit, as its uid with the pod's
// fsGroup, on a setgid directory of that group (what the kubelet makes of
// the emptyDir). The probes pass; the app's uid can call, another uid of
// the same group is refused; after SIGTERM the readiness probe fails
// (draining) while the app's connection is still served, and the sidecar
// exits 0 once the app has gone (after its min grace).
func TestSidecarRuns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the containers' uids (tests run as root in CI)")
	}
	for _, b := range pods(t) {
		p, err := DecodePod(b.Text)
		if err != nil {
			t.Fatal(err)
		}
		s, err := Recipe(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(p.Name, func(t *testing.T) { runSidecar(t, s) })
	}
}

func runSidecar(t *testing.T, s *Sidecar) {
	src := udskit(t)
	base, err := os.MkdirTemp("", "k8scheck")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	must(t, os.Chmod(base, 0o755))
	run := filepath.Join(base, "run")
	must(t, os.Mkdir(run, 0o777))
	must(t, os.Chown(run, 0, int(s.FSGroup)))
	must(t, os.Chmod(run, 0o777|os.ModeSetgid)) // the kubelet's emptyDir with fsGroup
	bin := filepath.Join(base, "udskit")
	data, err := os.ReadFile(src)
	must(t, err)
	must(t, os.WriteFile(bin, data, 0o755))
	sock := filepath.Join(run, filepath.Base(s.Socket))
	mapArgs := func(args []string) []string {
		out := make([]string, len(args))
		for i, a := range args {
			a = strings.ReplaceAll(a, s.MountPath, run)
			if filepath.Base(a) == "udskit" {
				a = bin
			}
			out[i] = a
		}
		return out
	}
	side := s.Container
	suid, sgid := *side.SecurityContext.RunAsUser, *side.SecurityContext.RunAsGroup
	auid, agid := *s.App.SecurityContext.RunAsUser, *s.App.SecurityContext.RunAsGroup
	// as runs args as uid/gid with the pod's fsGroup as a supplementary
	// group, as the kubelet runs a container.
	as := func(uid, gid int64, args ...string) *exec.Cmd {
		return exec.Command("setpriv", append([]string{fmt.Sprintf("--reuid=%d", uid), fmt.Sprintf("--regid=%d", gid),
			fmt.Sprintf("--groups=%d", s.FSGroup), "--"}, args...)...)
	}
	probe := func(cmd []string) (int, string) {
		c := as(suid, sgid, mapArgs(cmd)...)
		var out bytes.Buffer
		c.Stdout, c.Stderr = &out, &out
		err := c.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), out.String()
		} else if err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
		return 0, out.String()
	}

	sc := as(suid, sgid, mapArgs(append(append([]string{}, side.Command...), side.Args...))...)
	var slog lockedBuf
	sc.Stdout, sc.Stderr = &slog, &slog
	must(t, sc.Start())
	exited := make(chan error, 1)
	go func() { exited <- sc.Wait() }()
	t.Cleanup(func() {
		sc.Process.Kill()
		<-exited
	})

	// Start-up: the kubelet's gate before it starts the app.
	if s.Native {
		deadline := time.Now().Add(20 * time.Second)
		for {
			code, out := probe(side.StartupProbe.Exec.Command)
			if code == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("startupProbe still failing after 20s: %s\nsidecar: %s", out, slog.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	} else if code, out := probe(side.Lifecycle.PostStart.Exec.Command); code != 0 {
		t.Fatalf("postStart hook: exit %d: %s\nsidecar: %s", code, out, slog.String())
	}
	for what, cmd := range map[string][]string{"readiness": side.ReadinessProbe.Exec.Command, "liveness": side.LivenessProbe.Exec.Command} {
		if code, out := probe(cmd); code != 0 {
			t.Errorf("%s probe while serving: exit %d: %s", what, code, out)
		}
	}
	fi, err := os.Lstat(sock)
	must(t, err)
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o660 || int64(st.Gid) != s.FSGroup || int64(st.Uid) != suid {
		t.Errorf("socket %v owner %d:%d; want 0660 owned by the sidecar's uid %d and the fsGroup %d", fi.Mode().Perm(), st.Uid, st.Gid, suid, s.FSGroup)
	}

	// The app calls (newline JSON) and keeps its connection; another uid of
	// the same group is refused by --allow-uid.
	app := newLineClient(t, as(auid, agid, "socat", "-", "UNIX-CONNECT:"+sock))
	if line := app.call(t, 1); !strings.Contains(line, `"id":1`) || strings.Contains(line, "error") {
		t.Fatalf("the app's call: %q\nsidecar: %s", line, slog.String())
	}
	stranger := newLineClient(t, as(10003, 10003, "socat", "-", "UNIX-CONNECT:"+sock))
	// Refused: the connection closes, after a refusal message that names the
	// policy (never an answer to the call).
	if line := stranger.call(t, 1); strings.Contains(line, `"id":1`) || (line != "" && !strings.Contains(line, "refused")) {
		t.Errorf("uid 10003 (in the fsGroup, not in --allow-uid) was not refused: %q", line)
	}
	stranger.close()

	// The pod stops: SIGTERM. The sidecar lingers: not ready, still serving.
	term := time.Now()
	must(t, sc.Process.Signal(syscall.SIGTERM))
	deadline := time.Now().Add(3 * time.Second)
	for {
		code, out := probe(side.ReadinessProbe.Exec.Command)
		if code == 1 && strings.Contains(out, "draining") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readiness probe after SIGTERM: exit %d %q; want 1, draining", code, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if line := app.call(t, 2); !strings.Contains(line, `"id":2`) || strings.Contains(line, "error") {
		t.Fatalf("the app's call while the sidecar lingers: %q\nsidecar: %s", line, slog.String())
	}
	select {
	case err := <-exited:
		t.Fatalf("the sidecar exited (%v) with the app still connected\n%s", err, slog.String())
	default:
	}
	app.close()
	gone := time.Now()
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("sidecar exit: %v\n%s", err, slog.String())
		}
	case <-time.After(s.MinGrace + 5*time.Second):
		t.Fatalf("the sidecar still runs after the app left\n%s", slog.String())
	}
	end := gone
	if g := term.Add(s.MinGrace); g.After(end) {
		end = g
	}
	if late := time.Since(end); late > time.Second {
		t.Errorf("the sidecar exited %v after the app left (and its min grace passed); want within 1s", late)
	}
	if time.Since(term) < s.MinGrace {
		t.Errorf("the sidecar exited before its --drain-min-grace %v", s.MinGrace)
	}
}

// lineClient is a process (socat as some uid) speaking newline JSON.
type lineClient struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

func newLineClient(t *testing.T, cmd *exec.Cmd) *lineClient {
	t.Helper()
	in, err := cmd.StdinPipe()
	must(t, err)
	out, err := cmd.StdoutPipe()
	must(t, err)
	cmd.Stderr = io.Discard
	must(t, cmd.Start())
	c := &lineClient{cmd: cmd, in: in, lines: make(chan string, 4)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return c
}

// call sends an echo with id and returns the answer line ("" if the
// connection closed without one).
func (c *lineClient) call(t *testing.T, id int) string {
	t.Helper()
	fmt.Fprintf(c.in, `{"id":%d,"func":"echo","data":{"k":"v"}}`+"\n", id)
	select {
	case l := <-c.lines:
		return l
	case <-time.After(10 * time.Second):
		t.Fatalf("no answer to call %d within 10s", id)
	}
	return ""
}

// close ends the client's connection and waits for the process.
func (c *lineClient) close() {
	c.in.Close()
	c.cmd.Wait()
}

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
