// Package testutil holds the small helpers udskit's tests kept writing again:
// short temp dirs for socket paths, real unix listeners and conns that close
// themselves, accept loops that end with the test, fd and goroutine leak
// checks, a goroutine-safe buffer, and the test binary re-run as a helper
// process (optionally as uid nobody through setpriv).
//
// It depends on the standard library only, so any package's internal tests
// (package uds, package rpc, ...) can import it without an import cycle.
// Everything that can outlive a test is undone in t.Cleanup.
//
// Helper processes. A test binary doubles as a child process: TestMain hands
// control to Main with the helpers it offers; a test starts one with
// HelperCmd (same uid) or NobodyCmd (uid/gid 65534, skipped when not root or
// setpriv is absent), and either runs it to completion (RunJSON) or keeps it
// running (StartHelper, which waits for the child's Ready line).
//
//	func TestMain(m *testing.M) {
//		testutil.Main(m, map[string]testutil.HelperFunc{
//			"dial": func(addr string) int { ...; return testutil.PrintJSON(res) },
//			"hold": func(path string) int { c, _ := net.Dial("unix", path); testutil.Ready(); c.Close(); return 0 },
//		})
//	}
//
//	func TestAsNobody(t *testing.T) {
//		var res result
//		testutil.RunJSON(t, testutil.NobodyCmd(t, "dial", addr), &res)
//		child := testutil.StartHelper(t, testutil.HelperCmd(t, "hold", path))
//		_ = child.PID
//	}
//
// Servers and leaks.
//
//	dir := testutil.ShortDir(t, 0o755)                 // any user may search it
//	l := testutil.ListenUnix(t, filepath.Join(dir, "s.sock"))
//	testutil.Serve(t, l, testutil.Echo)                // accept loop, ends in t.Cleanup
//	c := testutil.DialUnix(t, l.Addr().String())
//	check := testutil.LeakCheck(t)                      // fds and goroutines now
//	... open and close things ...
//	check()                                             // waits until back to that baseline
//	testutil.NoGoroutinesIn(t, "udskit/rpc.")           // none of the package's goroutines left
package testutil
