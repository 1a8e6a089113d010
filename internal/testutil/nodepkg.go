package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	nodePkgOnce sync.Once
	nodePkgDir  string
	nodePkgErr  string
)

// NodePackage returns the directory of the udskit Node package
// (clients/node) with its dist/ built: npm ci when its dev dependencies are
// missing, npm run build when dist is older than src. Scripts import it by
// name through NodeModules. The test fails when node or npm are missing
// (scripts/install-deps.sh installs them) or nothing is built.
func NodePackage(t testing.TB) string {
	t.Helper()
	nodePkgOnce.Do(func() {
		root, err := repoRoot()
		if err != nil {
			nodePkgErr = err.Error()
			return
		}
		pkg := filepath.Join(root, "clients", "node")
		nodePkgDir = pkg
		run := func(args ...string) string {
			cmd := exec.Command(args[0], args[1:]...)
			cmd.Dir = pkg
			out, err := cmd.CombinedOutput()
			if err != nil {
				return strings.Join(args, " ") + ": " + err.Error() + "\n" + string(out)
			}
			return ""
		}
		if !nodeDistStale(pkg) {
			return
		}
		if _, err := os.Stat(filepath.Join(pkg, "node_modules", ".bin", "tsc")); err != nil {
			if msg := run("npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"); msg != "" {
				nodePkgErr = msg
				return
			}
		}
		if msg := run("npm", "run", "build"); msg != "" && nodeDistStale(pkg) {
			nodePkgErr = msg
		}
	})
	if nodePkgErr != "" {
		t.Fatalf("testutil: building the Node package: %s", nodePkgErr)
	}
	return nodePkgDir
}

// NodeModules makes a node_modules dir in a temp dir in which `udskit`
// resolves to the built Node package, and returns the temp dir: a script
// written there imports 'udskit' as a user's would.
func NodeModules(t testing.TB) string {
	t.Helper()
	pkg := NodePackage(t)
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "node_modules"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(pkg, filepath.Join(dir, "node_modules", "udskit")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// nodeDistStale reports whether dist/index.js is missing or older than a
// file under src/.
func nodeDistStale(pkg string) bool {
	built, err := os.Stat(filepath.Join(pkg, "dist", "index.js"))
	if err != nil {
		return true
	}
	stale := false
	filepath.WalkDir(filepath.Join(pkg, "src"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if fi, err := d.Info(); err == nil && fi.ModTime().After(built.ModTime().Add(time.Second)) {
			stale = true
		}
		return nil
	})
	return stale
}

// repoRoot finds the module root (the dir with go.mod) above the working
// directory.
func repoRoot() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", os.ErrNotExist
		}
		d = parent
	}
}
