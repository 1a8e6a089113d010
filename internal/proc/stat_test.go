package proc

import (
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// A /proc/PID/stat line whose command name holds spaces and a ')'.
const statLine = "4242 (a) b (c)) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 40 7 3 20 0 1 0 123 4096 200 18446744073709551615\n"

func TestParseStat(t *testing.T) {
	s, ok := parseStat(statLine)
	want := Stat{PPID: 17, User: 2500 * time.Millisecond, System: 400 * time.Millisecond, ChildUser: 70 * time.Millisecond, ChildSystem: 30 * time.Millisecond}
	if !ok || s != want {
		t.Fatalf("parseStat = %+v %v, want %+v", s, ok, want)
	}
	if s.CPU() != 2900*time.Millisecond {
		t.Fatalf("CPU = %v", s.CPU())
	}
	for _, bad := range []string{"", "4242 no parens", "4242 (x) S 17 1 2", "4242 (x) S pp 1 1 0 -1 0 0 0 0 0 1 2 3 4"} {
		if _, ok := parseStat(bad); ok {
			t.Errorf("parseStat(%q) ok", bad)
		}
	}
}

func TestStatusKB(t *testing.T) {
	status := "Name:\tx\nVmHWM:\t    2048 kB\nVmRSS:\t    1024 kB\nThreads:\t3\n"
	for name, want := range map[string]int64{"VmRSS": 1024, "VmHWM": 2048, "Threads": 3} {
		if got, ok := ParseStatus(status).KB(name); !ok || got != want {
			t.Errorf("KB(%s) = %d %v, want %d", name, got, ok, want)
		}
	}
	if _, ok := ParseStatus(status).KB("VmSwap"); ok {
		t.Error("KB found a missing line")
	}
}

func TestSelf(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("no /proc")
	}
	s, ok := ReadStat(os.Getpid())
	if !ok || s.PPID != os.Getppid() {
		t.Fatalf("ReadStat(self) = %+v %v, want ppid %d", s, ok, os.Getppid())
	}
	if kb, ok := StatusKB(os.Getpid(), "VmRSS"); !ok || kb <= 0 {
		t.Fatalf("StatusKB(self, VmRSS) = %d %v", kb, ok)
	}
	if _, ok := ReadStat(-1); ok {
		t.Fatal("ReadStat(-1) ok")
	}
	if u, s := SelfCPU(); u+s <= 0 {
		t.Fatalf("SelfCPU = %v + %v", u, s)
	}
}

// FuzzParseStat: any text parses or is refused, never a panic; what parses
// has a command name in parentheses and the 15 fields after it.
func FuzzParseStat(f *testing.F) {
	f.Add(statLine)
	f.Add("1 ()) S 0 0 0 0 0 0 0 0 0 0 -1 2 3 4")
	f.Fuzz(func(t *testing.T, s string) {
		if _, ok := parseStat(s); ok {
			i := strings.LastIndexByte(s, ')')
			if i < 0 || len(strings.Fields(s[i+1:])) < 15 {
				t.Fatalf("%q parsed without a name and 15 fields after it", s)
			}
		}
	})
}
