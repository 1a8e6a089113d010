package doccheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExtractModesAndPositions(t *testing.T) {
	dir := t.TempDir()
	md := "# t\n\n```go\npackage main\n\nfunc main() {}\n```\n\ntext\n\n```go drain=/tmp/x.sock\npackage main\n```\n\n```go fragment\nx := 1\n```\n\n```sh\nnot go\n```\n"
	os.WriteFile(filepath.Join(dir, "a.md"), []byte(md), 0o644)
	bs, err := Extract(dir, "a.md")
	if err != nil || len(bs) != 3 {
		t.Fatalf("%d blocks, %v", len(bs), err)
	}
	if b := bs[0]; b.Mode != "run" || b.Package != "main" || b.Line != 4 || b.Pos(3) != "a.md:6" {
		t.Errorf("block 0: %+v pos %s", b, b.Pos(3))
	}
	if b := bs[1]; b.Mode != "drain" || b.Addr != "/tmp/x.sock" {
		t.Errorf("block 1: %+v", b)
	}
	if b := bs[2]; b.Mode != "fragment" || ParseFragment(b) != nil {
		t.Errorf("block 2: %+v %v", b, ParseFragment(b))
	}
	// A compile error position maps back to the Markdown line.
	got := mapPositions("./b07/example.go:3:5: undefined: y", map[string]Block{"b07": bs[0]})
	if got != "a.md:6:5: undefined: y" {
		t.Errorf("mapped %q", got)
	}
	for _, bad := range []struct{ md, want string }{
		{"```go\nx := 1\n```\n", "a.md:1: a go block without a package clause"},
		{"```go nonsense\npackage main\n```\n", `unknown word "nonsense"`},
		{"```go serve\npackage main\n```\n", "serve needs an address"},
		{"```go\npackage main\n", "never closed"},
	} {
		os.WriteFile(filepath.Join(dir, "a.md"), []byte(bad.md), 0o644)
		if _, err := Extract(dir, "a.md"); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: %v, want %q", bad.md, err, bad.want)
		}
	}
	if err := ParseFragment(Block{File: "a.md", Line: 10, Code: "x := 1\ny := (\n"}); err == nil || !strings.HasPrefix(err.Error(), "a.md:1") {
		t.Errorf("broken fragment: %v", err)
	}
}
