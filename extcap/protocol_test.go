package extcap

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/udskit/udskit/internal/testutil"
	"github.com/udskit/udskit/socklist"
)

// sentence is one extcap line: a keyword and {key=value} fields, nothing else.
var sentence = regexp.MustCompile(`^(extcap|interface|dlt|arg|value) (\{[a-z]+=[^{}\n]*\})+$`)

func lines(t *testing.T, b *bytes.Buffer) []string {
	t.Helper()
	ls := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	for _, l := range ls {
		if !sentence.MatchString(l) {
			t.Errorf("not an extcap sentence: %q", l)
		}
	}
	return ls
}

func TestWriteInterfacesAndDLTs(t *testing.T) {
	var b bytes.Buffer
	if err := WriteInterfaces(&b); err != nil {
		t.Fatal(err)
	}
	ls := lines(t, &b)
	if len(ls) != 2 || !strings.HasPrefix(ls[1], "interface {value=udskit}") {
		t.Fatalf("interfaces: %q", ls)
	}
	b.Reset()
	if err := WriteDLTs(&b, Interface); err != nil {
		t.Fatal(err)
	}
	if ls := lines(t, &b); len(ls) != 1 || !strings.HasPrefix(ls[0], "dlt {number=101}") {
		t.Fatalf("dlts: %q", ls)
	}
	var unknown ErrUnknownInterface
	if err := WriteDLTs(&b, "eth0"); !errors.As(err, &unknown) {
		t.Fatalf("unknown interface: %v", err)
	}
}

func TestWriteConfigChoices(t *testing.T) {
	var b bytes.Buffer
	choices := []Choice{
		{Value: "/run/app.sock", Display: "/run/app.sock (app 12)"},
		{Value: "/tmp/evil}{call=--x}.sock", Display: "evil"}, // cannot be a field: left out
		{Value: "/tmp/ok.sock", Display: "/tmp/ok.sock (na{me}\n 7)"},
	}
	if err := WriteConfig(&b, Interface, choices); err != nil {
		t.Fatal(err)
	}
	ls := lines(t, &b)
	text := strings.Join(ls, "\n")
	for _, want := range []string{"{call=--socket}", "{call=--mode}", "{call=--pid}", "{call=--snaplen}", "{call=--port}",
		"value {arg=0}{value=/run/app.sock}{display=/run/app.sock (app 12)}",
		"value {arg=0}{value=/tmp/ok.sock}{display=/tmp/ok.sock (na(me)  7)}",
		"value {arg=1}{value=interpose}", "value {arg=1}{value=kernel}"} {
		if !strings.Contains(text, want) {
			t.Errorf("config lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "evil") {
		t.Errorf("a path with braces was offered:\n%s", text)
	}
	b.Reset()
	if err := WriteReload(&b, Interface, "--socket", choices); err != nil {
		t.Fatal(err)
	}
	if ls := lines(t, &b); len(ls) != 2 || !strings.HasPrefix(ls[0], "value {arg=0}") {
		t.Fatalf("reload: %q", ls)
	}
	if err := WriteReload(&b, Interface, "--mode", choices); err == nil {
		t.Fatal("reload of --mode accepted")
	}
}

// TestChoicesListsListener: a socket listening in a temp dir is offered,
// with its owner; a connected (non-listening) socket is not.
func TestChoicesListsListener(t *testing.T) {
	dir := testutil.ShortDir(t, 0o700)
	path := filepath.Join(dir, "c.sock")
	l := testutil.ListenUnix(t, path)
	c := testutil.DialUnix(t, path)
	defer c.Close()
	s := testutil.Accept(t, l)
	defer s.Close()
	ch, err := Choices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range ch {
		if c.Value == path {
			n++
			if !strings.Contains(c.Display, "1 clients") || !strings.Contains(c.Display, " "+strconv.Itoa(os.Getpid())) {
				t.Errorf("display %q: want this pid and 1 client", c.Display)
			}
		}
	}
	if n != 1 {
		t.Fatalf("%s offered %d times in %d choices", path, n, len(ch))
	}
}

func TestChoicesFromFilters(t *testing.T) {
	socks := []socklist.Socket{
		{Path: "/b.sock", Type: "stream", State: socklist.StateListening},
		{Path: "/a.sock", Type: "stream", State: socklist.StateListening},
		{Path: "/a.sock", Type: "stream", State: socklist.StateListening}, // same path twice (two namespaces' views)
		{Path: "@abstract", Type: "stream", State: socklist.StateListening},
		{Path: "/d.sock", Type: "dgram", State: socklist.StateUnconnected},
	}
	got := choicesFrom(socks)
	if len(got) != 2 || got[0].Value != "/a.sock" || got[1].Value != "/b.sock" {
		t.Fatalf("choices %+v", got)
	}
}

func TestFolderFrom(t *testing.T) {
	v40 := "Temp:                \t/tmp\nPersonal configuration:\t/home/u/.config/wireshark\nExtcap path:         \t/usr/lib/x86_64-linux-gnu/wireshark/extcap\n"
	if d, err := folderFrom([]byte(v40)); err != nil || d != "/home/u/.config/wireshark/extcap" {
		t.Fatalf("4.0: %q %v", d, err)
	}
	v44 := v40 + "Personal Extcap path:\t/home/u/.local/lib/wireshark/extcap\n"
	if d, err := folderFrom([]byte(v44)); err != nil || d != "/home/u/.local/lib/wireshark/extcap" {
		t.Fatalf("4.4: %q %v", d, err)
	}
	if _, err := folderFrom([]byte("Temp: /tmp\n")); err == nil {
		t.Fatal("no personal folder: no error")
	}
}

func FuzzFolderFrom(f *testing.F) {
	f.Add([]byte("Personal configuration:\t/h/.config/wireshark\n"))
	f.Add([]byte("Personal Extcap path:\t/x\nPersonal configuration: /y\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := folderFrom(b)
		if err == nil && d == "" {
			t.Fatal("empty folder without an error")
		}
	})
}

func TestInstall(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "extcap")
	bin := "/opt/it's here/udskit"
	p, err := Install(context.Background(), InstallOptions{Dir: dir, Binary: bin})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if want := `exec '/opt/it'\''s here/udskit' extcap "$@"`; !strings.Contains(string(b), want) {
		t.Fatalf("launcher:\n%s\nwant %s", b, want)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o755 {
		t.Fatalf("launcher mode %v", fi.Mode())
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Fatalf("folder mode %v", fi.Mode())
	}
	// Installing again replaces our own launcher.
	if _, err := Install(context.Background(), InstallOptions{Dir: dir, Binary: "/usr/bin/udskit"}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); !strings.Contains(string(b), "'/usr/bin/udskit'") {
		t.Fatalf("not replaced:\n%s", b)
	}
	if _, err := Uninstall(context.Background(), InstallOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("after uninstall: %v", err)
	}
	// Someone else's file, or a symlink, is never replaced nor removed.
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho theirs\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(context.Background(), InstallOptions{Dir: dir, Binary: bin}); err == nil || !strings.Contains(err.Error(), "not a udskit launcher") {
		t.Fatalf("foreign file replaced: %v", err)
	}
	if _, err := Uninstall(context.Background(), InstallOptions{Dir: dir}); err == nil {
		t.Fatal("foreign file removed")
	}
	os.Remove(p)
	target := filepath.Join(t.TempDir(), "target")
	os.WriteFile(target, []byte(launcherMark+"\n"), 0o600)
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(context.Background(), InstallOptions{Dir: dir, Binary: bin}); err == nil {
		t.Fatal("installed through a symlink")
	}
	if b, _ := os.ReadFile(target); string(b) != launcherMark+"\n" {
		t.Fatalf("symlink target written: %q", b)
	}
}
