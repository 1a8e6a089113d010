package proc

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// fakeRoot builds a proc tree with one process, 42, holding files.
func fakeRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "42")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// Every read is capped: comm is cut at MaxComm, status and stat over their
// caps are an error, not unbounded memory.
func TestReadCaps(t *testing.T) {
	root := fakeRoot(t, map[string]string{
		"comm":   strings.Repeat("c", 10*MaxComm) + "\n",
		"status": "Uid:\t1 2 3 4\n" + strings.Repeat("x", MaxStatus),
	})
	c, err := CommAt(root, 42)
	if err != nil || c != strings.Repeat("c", MaxComm) {
		t.Fatalf("CommAt = %d bytes %v, want cut at %d", len(c), err, MaxComm)
	}
	if _, err := ReadStatusAt(root, 42); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("ReadStatusAt over the cap: %v, want ErrTooLarge", err)
	}
	big := filepath.Join(root, "big")
	if err := os.WriteFile(big, []byte(strings.Repeat("s", MaxStat+1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readCapped(big, MaxStat, false); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("stat over the cap: %v, want ErrTooLarge", err)
	}
	small, err := ReadSmall(big)
	if err != nil || len(small) != MaxStat+1 {
		t.Fatalf("ReadSmall = %d bytes %v", len(small), err)
	}
	huge := filepath.Join(root, "huge")
	if err := os.WriteFile(huge, []byte(strings.Repeat("h", 2*MaxSmallFile)), 0o600); err != nil {
		t.Fatal(err)
	}
	if small, err := ReadSmall(huge); err != nil || len(small) != MaxSmallFile {
		t.Fatalf("ReadSmall of a file over the cap = %d bytes %v, want cut at %d", len(small), err, MaxSmallFile)
	}
	if _, err := CommAt(root, 7); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("CommAt of a missing pid: %v", err)
	}
}

func TestStatusFields(t *testing.T) {
	root := fakeRoot(t, map[string]string{"status": "Name:\tpostgres\nUid:\t1000\t1001\t1000\t1000\nGid:\t50\t51\t50\t50\n" +
		"Groups:\t4 24 27 x 1000 \nCapEff:\t000001ffffffffff\nVmRSS:\t  1024 kB\n"})
	st, err := ReadStatusAt(root, 42)
	if err != nil {
		t.Fatal(err)
	}
	if uid, gid := st.IDs(); uid != 1001 || gid != 51 {
		t.Errorf("IDs = %d %d, want the effective 1001 51", uid, gid)
	}
	if gs := st.Groups(); !slices.Equal(gs, []uint32{4, 24, 27, 1000}) {
		t.Errorf("Groups = %v", gs)
	}
	if c, err := st.CapEff(); err != nil || c != 0x1ffffffffff {
		t.Errorf("CapEff = %x %v", c, err)
	}
	if kb, ok := st.KB("VmRSS"); !ok || kb != 1024 {
		t.Errorf("KB(VmRSS) = %d %v", kb, ok)
	}
	var zero Status
	if uid, gid := zero.IDs(); uid != -1 || gid != -1 || zero.Groups() != nil {
		t.Errorf("zero Status: %d %d %v", uid, gid, zero.Groups())
	}
	if _, err := zero.CapEff(); err == nil {
		t.Error("zero Status has a CapEff")
	}
	many := "Groups:" + strings.Repeat(" 7", 3*MaxGroups) + "\n"
	if n := len(ParseStatus(many).Groups()); n != MaxGroups {
		t.Errorf("Groups kept %d, want the cap %d", n, MaxGroups)
	}
}

func TestParseSocketLink(t *testing.T) {
	for target, want := range map[string]uint64{"socket:[12345]": 12345, "socket:[0]": 0} {
		if got, ok := ParseSocketLink(target); !ok || got != want {
			t.Errorf("%q = %d %v", target, got, ok)
		}
	}
	for _, bad := range []string{"pipe:[12]", "socket:[12", "socket:[]", "socket:[-1]", "/dev/null", "socket:[1]x"} {
		if _, ok := ParseSocketLink(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

// This process's own sockets are found in /proc/self/fd, and the process by
// one of them.
func TestSocketInodesSelf(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("no /proc")
	}
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f, err := ln.(*net.UnixListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	inos, err := SocketInodes(Root, os.Getpid())
	if err != nil || !slices.Contains(inos, st.Ino) {
		t.Fatalf("SocketInodes(self) = %v %v, want %d among them", inos, err, st.Ino)
	}
	if pid := PIDWithSocket("", st.Ino); pid != os.Getpid() {
		t.Fatalf("PIDWithSocket = %d, want %d", pid, os.Getpid())
	}
	before, err := CountFDs(os.Getpid())
	if err != nil || before < 4 {
		t.Fatalf("CountFDs(self) = %d %v", before, err)
	}
	g, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := CountFDs(os.Getpid())
	g.Close()
	if after != before+1 {
		t.Errorf("CountFDs after opening one file: %d, want %d", after, before+1)
	}
	if c := Comm(os.Getpid()); c == "" || len(c) > 16 {
		t.Fatalf("Comm(self) = %q", c)
	}
	if st, err := ReadStatus(0); err != nil {
		t.Fatal(err)
	} else if uid, _ := st.IDs(); uid != os.Geteuid() {
		t.Fatalf("ReadStatus(self) uid %d, want %d", uid, os.Geteuid())
	}
}

func FuzzStatus(f *testing.F) {
	f.Add("Uid:\t1 2 3 4\nGroups:\t1 2\nCapEff:\tff\nVmRSS:\t 3 kB\n")
	f.Add("Uid:\nGroups:" + strings.Repeat(" 9", 2000))
	f.Fuzz(func(t *testing.T, s string) {
		st := ParseStatus(s)
		uid, gid := st.IDs()
		if uid < -1 || gid < -1 {
			t.Fatalf("ids %d %d", uid, gid)
		}
		if len(st.Groups()) > MaxGroups {
			t.Fatal("more groups than the cap")
		}
		st.CapEff()
		st.KB("VmRSS")
	})
}

func FuzzParseSocketLink(f *testing.F) {
	f.Add("socket:[1]")
	f.Add("socket:[18446744073709551615]")
	f.Fuzz(func(t *testing.T, s string) {
		if ino, ok := ParseSocketLink(s); ok && !strings.Contains(s, "]") {
			t.Fatalf("%q parsed to %d without a ]", s, ino)
		}
	})
}
