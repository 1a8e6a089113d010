package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/udskit/udskit/internal/testutil"
)

// The sidecar's life in a pod (docs/kubernetes.md): Kubernetes sends SIGTERM
// to the app and the sidecar at the same moment, and the app still calls
// the sidecar during its own shutdown. The apps are Node programs in
// testdata/pod: one speaks newline JSON the way the Pipedrive article's
// client does, one uses the udskit Node package (clients/node/dist).

var (
	nodeDistOnce sync.Once
	nodeDistDir  string
	nodeDistErr  string
)

// nodeDist returns clients/node/dist, building it (npm ci, npm run build)
// when it is missing or older than a source file.
func nodeDist(t *testing.T) string {
	t.Helper()
	nodeDistOnce.Do(func() {
		pkg, err := filepath.Abs("../../clients/node")
		if err != nil {
			nodeDistErr = err.Error()
			return
		}
		nodeDistDir = filepath.Join(pkg, "dist")
		if !distStale(pkg) {
			return
		}
		run := func(args ...string) bool {
			cmd := exec.Command(args[0], args[1:]...)
			cmd.Dir = pkg
			if out, err := cmd.CombinedOutput(); err != nil {
				nodeDistErr = strings.Join(args, " ") + ": " + err.Error() + "\n" + string(out)
				return false
			}
			return true
		}
		if _, err := os.Stat(filepath.Join(pkg, "node_modules", ".bin", "tsc")); err != nil {
			if !run("npm", "ci", "--no-audit", "--no-fund") {
				return
			}
		}
		run("npm", "run", "build")
	})
	if nodeDistErr != "" {
		t.Fatalf("building the Node package for the app: %s", nodeDistErr)
	}
	return nodeDistDir
}

func distStale(pkg string) bool {
	built, err := os.Stat(filepath.Join(pkg, "dist", "index.js"))
	if err != nil {
		return true
	}
	srcs, _ := filepath.Glob(filepath.Join(pkg, "src", "*.ts"))
	for _, s := range srcs {
		if fi, err := os.Stat(s); err == nil && fi.ModTime().After(built.ModTime()) {
			return true
		}
	}
	return false
}

// podApp is one app process (testdata/pod/KIND-app.mjs).
type podApp struct {
	cmd     *exec.Cmd
	stderr  *testutil.Buffer
	ready   chan struct{}
	done    chan appStats  // its final counters, when it printed them
	dropped chan time.Time // when it closed its connection for RECONNECT_MS
	doneAt  time.Time      // when the done line arrived (its connection is closed by then)
	exited  chan error
}

type appStats struct {
	Calls, Failed, FailedBeforeTerm, Connects int
	Codes                                     map[string]int
	Errors                                    []string
}

func startApp(t *testing.T, kind, sock string, env ...string) *podApp {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node not installed (scripts/install-deps.sh)")
	}
	cmd := exec.Command(node, filepath.Join("testdata", "pod", kind+"-app.mjs"))
	cmd.Env = append(os.Environ(), append([]string{"SOCK=" + sock, "UDSKIT_NODE_DIST=" + nodeDist(t)}, env...)...)
	a := &podApp{cmd: cmd, stderr: &testutil.Buffer{}, ready: make(chan struct{}), done: make(chan appStats, 1),
		dropped: make(chan time.Time, 1), exited: make(chan error, 1)}
	cmd.Stderr = a.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan struct{})
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var ev struct {
				Event string `json:"event"`
				appStats
			}
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Errorf("%s app printed %q: %v", kind, sc.Text(), err)
				continue
			}
			switch ev.Event {
			case "ready":
				close(a.ready)
			case "dropped":
				a.dropped <- time.Now()
			case "done":
				a.doneAt = time.Now()
				a.done <- ev.appStats
			}
		}
	}()
	go func() {
		<-lines
		a.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-a.exited
	})
	return a
}

func (a *podApp) waitReady(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case <-a.ready:
	case <-time.After(within):
		t.Fatalf("the app made no successful call within %v; its stderr: %s", within, a.stderr)
	}
}

func (a *podApp) waitDone(t *testing.T, within time.Duration) appStats {
	t.Helper()
	select {
	case st := <-a.done:
		return st
	case <-time.After(within):
		t.Fatalf("the app did not finish within %v; its stderr: %s", within, a.stderr)
	}
	return appStats{}
}

// sigterm sends SIGTERM to every process as close together as it can: a
// pod's containers get it at the same moment.
func sigterm(t *testing.T, ps ...*os.Process) time.Time {
	t.Helper()
	at := time.Now()
	for _, p := range ps {
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	return at
}

// podSock is a socket path in a fresh private dir, short enough for sun_path.
func podSock(t *testing.T) string {
	return filepath.Join(testutil.ShortDir(t, 0o700), "sidecar.sock")
}

// TestPodShutdownLinger: with --drain linger the app's calls during its own
// 3 s shutdown all succeed, a reconnect after SIGTERM included (the
// newline-JSON app drops its connection 1.5 s in), and the sidecar exits
// within 1 s after the app's last connection closed.
func TestPodShutdownLinger(t *testing.T) {
	for _, kind := range []string{"ndjson", "udskit"} {
		t.Run(kind, func(t *testing.T) {
			sock := podSock(t)
			side := scServe(t, sock, "--drain", "linger", "--drain-min-grace", "500ms", "--drain-timeout", "20s")
			app := startApp(t, kind, sock, "SHUTDOWN_MS=3000", "RECONNECT_MS=1500")
			app.waitReady(t, 20*time.Second)
			time.Sleep(200 * time.Millisecond) // calls flowing
			term := sigterm(t, side.cmd.Process, app.cmd.Process)

			st := app.waitDone(t, 15*time.Second)
			if st.Failed != 0 {
				t.Errorf("%d of %d calls failed during the pod's shutdown: %v", st.Failed, st.Calls, st.Errors)
			}
			if st.Calls < 50 {
				t.Errorf("only %d calls in 3 s of shutdown; the app did not keep calling", st.Calls)
			}
			if kind == "ndjson" && st.Connects != 2 {
				t.Errorf("the app connected %d times; want 2 (its reconnect after SIGTERM accepted)", st.Connects)
			}
			if el := app.doneAt.Sub(term); el < 2900*time.Millisecond {
				t.Errorf("the app finished %v after SIGTERM, before its 3 s shutdown", el)
			}
			if err := side.wait(t, 5*time.Second); err != nil {
				t.Fatalf("sidecar exited with %v; log %s", err, side.stderr)
			}
			exited := time.Now()
			gap := exited.Sub(app.doneAt)
			if gap > time.Second {
				t.Errorf("sidecar exited %v after the app's last connection closed; want within 1s", gap)
			}
			t.Logf("%s app: %d calls during 3 s of shutdown, %d failed; sidecar exited %v after the app's last connection closed",
				kind, st.Calls, st.Failed, gap.Round(time.Millisecond))
			log := side.stderr.String()
			for _, want := range []string{"draining (linger)", "no client left", "serve drained; stopped"} {
				if !strings.Contains(log, want) {
					t.Errorf("sidecar log lacks %q:\n%s", want, log)
				}
			}
			if strings.Contains(log, "level=ERROR") {
				t.Errorf("sidecar logged an error:\n%s", log)
			}
			if s := app.stderr.String(); s != "" {
				t.Errorf("the app logged: %s", s)
			}
		})
	}
}

// TestPodShutdownLingerDeadline: a client that never leaves keeps a
// lingering sidecar only until --drain-timeout; meanwhile the sidecar keeps
// accepting and answering (a new call after SIGTERM succeeds), and with no
// client at all it still waits out --drain-min-grace.
func TestPodShutdownLingerDeadline(t *testing.T) {
	sock := podSock(t)
	side := scServe(t, sock, "--drain", "linger", "--drain-timeout", "1500ms")
	hold := testutil.DialUnix(t, sock) // holds its connection forever
	defer hold.Close()
	waitLog(t, "serve", side.stderr, "msg=connect")
	if r := scRun(t, "", "health", side.addr); r.code != 0 {
		t.Fatalf("udskit health while serving: exit %d %s", r.code, r.stderr)
	}
	term := sigterm(t, side.cmd.Process)
	waitLog(t, "serve", side.stderr, "draining (linger)")
	if r := scRun(t, "", "health", side.addr); r.code != 1 || !strings.Contains(r.stderr, "draining") {
		t.Errorf("udskit health while lingering: exit %d %q; want 1, draining (a readiness probe fails)", r.code, r.stderr)
	}
	if r := scRun(t, "", "call", side.addr, "echo", `{"after":"sigterm"}`); r.code != 0 || !strings.Contains(r.stdout, "sigterm") {
		t.Errorf("a new call while lingering: exit %d, %q %q; want it answered", r.code, r.stdout, r.stderr)
	}
	if err := side.wait(t, 5*time.Second); err != nil {
		t.Fatalf("sidecar exited with %v; log %s", err, side.stderr)
	}
	if el := time.Since(term); el < 1400*time.Millisecond || el > 3*time.Second {
		t.Errorf("sidecar exited %v after SIGTERM with a client that never leaves; want at the 1.5s --drain-timeout", el)
	}
	if log := side.stderr.String(); !strings.Contains(log, "drain timeout: closed the remaining connections") {
		t.Errorf("sidecar log does not say the drain timed out:\n%s", log)
	}
	// The held connection was closed by the sidecar.
	hold.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := hold.Read(make([]byte, 1)); err == nil {
		t.Error("the held connection is still open after the sidecar exited")
	}

	sock = podSock(t)
	side = scServe(t, sock, "--drain", "linger", "--drain-min-grace", "1s", "--drain-timeout", "10s")
	term = sigterm(t, side.cmd.Process)
	if err := side.wait(t, 5*time.Second); err != nil {
		t.Fatalf("sidecar exited with %v; log %s", err, side.stderr)
	}
	if el := time.Since(term); el < 950*time.Millisecond || el > 2500*time.Millisecond {
		t.Errorf("sidecar with no client exited %v after SIGTERM; want just after the 1s --drain-min-grace", el)
	}
}

// TestPodShutdownGoaway is the same pod with today's default drain, for
// what it guarantees: the sidecar stops accepting at once (its socket file
// is gone within a second), no call made before the SIGTERM fails, calls
// on a connection the app keeps open are still answered (a udskit client
// is told to go away and its later calls fail "unavailable", not
// processed; an NDJSON connection is served until it goes quiet), and the
// sidecar exits once those connections are done. What fails is the app's
// reconnect during its shutdown (the newline-JSON app drops its connection
// 300 ms in; the udskit client moves off the connection it was told to
// leave): there is no socket to connect to any more. That is why a
// sidecar in a pod wants --drain linger.
func TestPodShutdownGoaway(t *testing.T) {
	for _, kind := range []string{"ndjson", "udskit"} {
		t.Run(kind, func(t *testing.T) {
			sock := podSock(t)
			side := scServe(t, sock, "--drain-timeout", "20s")
			app := startApp(t, kind, sock, "SHUTDOWN_MS=1500", "RECONNECT_MS=300")
			app.waitReady(t, 20*time.Second)
			time.Sleep(200 * time.Millisecond)
			term := sigterm(t, side.cmd.Process, app.cmd.Process)
			deadline := time.Now().Add(time.Second)
			for {
				if _, err := os.Lstat(sock); os.IsNotExist(err) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the socket file is still there 1s after SIGTERM with --drain goaway")
				}
				time.Sleep(5 * time.Millisecond)
			}
			if err := side.wait(t, 5*time.Second); err != nil {
				t.Fatalf("sidecar exited with %v; log %s", err, side.stderr)
			}
			exitAt := time.Now()
			sideExit := exitAt.Sub(term)
			if sideExit > 1300*time.Millisecond {
				// Its clients leave by 300 ms in: the NDJSON app drops its
				// connection then (unless the drain closed it first, quiet
				// for 20 ms on a loaded machine); the udskit client leaves
				// the connection it was told to.
				t.Errorf("goaway sidecar exited %v after SIGTERM; want within 1s of its clients leaving (by 300 ms)", sideExit)
			}
			if kind == "ndjson" {
				select {
				case at := <-app.dropped:
					if gap := exitAt.Sub(at); gap > time.Second {
						t.Errorf("goaway sidecar exited %v after the app closed its connection; want within 1s", gap)
					}
				default: // the drain closed the quiet connection before the app dropped it
				}
			}
			st := app.waitDone(t, 15*time.Second)
			if st.FailedBeforeTerm != 0 {
				t.Errorf("%d calls failed before SIGTERM: %v", st.FailedBeforeTerm, st.Errors)
			}
			if st.Failed == 0 {
				t.Errorf("no call failed after the goaway sidecar exited (%d calls); the test no longer shows why linger exists", st.Calls)
			}
			if kind == "udskit" {
				for code, n := range st.Codes {
					if code != "unavailable" && code != "deadline_exceeded" {
						t.Errorf("%d calls failed with %q; want only unavailable (not processed) or deadline_exceeded (no server to reconnect to): %v", n, code, st.Errors)
					}
				}
			}
			t.Logf("%s app: %d calls, %d failed after SIGTERM; sidecar exited %v after SIGTERM", kind, st.Calls, st.Failed, sideExit.Round(time.Millisecond))
		})
	}
}

// TestPodStartupRace: the app starts 2 s before its sidecar. Its first call
// succeeds once the sidecar is up, and neither logs anything as a failure.
func TestPodStartupRace(t *testing.T) {
	for _, kind := range []string{"ndjson", "udskit"} {
		t.Run(kind, func(t *testing.T) {
			sock := podSock(t)
			app := startApp(t, kind, sock, "SHUTDOWN_MS=300")
			// A start-up gate (a postStart hook, ExecStartPre) waiting too.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			gate := scCLI(ctx, "health", "--wait", "--timeout", "20s", sock)
			var gateErr testutil.Buffer
			gate.Stderr = &gateErr
			if err := gate.Start(); err != nil {
				t.Fatal(err)
			}
			gated := make(chan error, 1)
			go func() { gated <- gate.Wait() }()
			time.Sleep(2 * time.Second)
			select {
			case <-app.ready:
				t.Fatal("the app reported a successful call before the sidecar started")
			default:
			}
			up := time.Now()
			side := scServe(t, sock, "--drain", "linger", "--drain-timeout", "10s")
			app.waitReady(t, 10*time.Second)
			if el := time.Since(up); el > 3*time.Second {
				t.Errorf("the app's first call succeeded %v after the sidecar started", el)
			}
			select {
			case err := <-gated:
				if err != nil {
					t.Errorf("udskit health --wait started before the sidecar: %v %s", err, gateErr.String())
				}
			case <-time.After(5 * time.Second):
				t.Error("udskit health --wait still waiting 5s after the sidecar started")
			}
			sigterm(t, side.cmd.Process, app.cmd.Process)
			st := app.waitDone(t, 10*time.Second)
			if st.Failed != 0 {
				t.Errorf("%d of %d calls failed: %v", st.Failed, st.Calls, st.Errors)
			}
			if s := app.stderr.String(); s != "" {
				t.Errorf("the app logged while waiting for its sidecar: %s", s)
			}
			if err := side.wait(t, 5*time.Second); err != nil {
				t.Fatalf("sidecar exited with %v; log %s", err, side.stderr)
			}
			if log := side.stderr.String(); strings.Contains(log, "level=ERROR") || strings.Contains(log, "level=WARN") {
				t.Errorf("the sidecar logged a failure:\n%s", log)
			}
		})
	}
}
