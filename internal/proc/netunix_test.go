package proc

import (
	"strings"
	"testing"
)

// A table recorded on Linux 6.x, plus the shapes that must be skipped.
const recorded = `Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 100 /run/pg/.s.PGSQL.5432
0000000000000000: 00000003 00000000 00000000 0001 03 101 /run/pg/.s.PGSQL.5432
0000000000000000: 00000003 00000000 00000000 0001 03 102
0000000000000000: 00000002 00000000 00000000 0002 01 103 @abstract name with spaces
0000000000000000: 00000002 00000000 00000000 0005 01 104
garbage line
0000000000000000: 00000002 00000000 zz 0001 01 105 /bad/flags
`

func TestScanNetUnixRecorded(t *testing.T) {
	var got []UnixEntry
	bad, err := ScanNetUnix(strings.NewReader(recorded), func(e UnixEntry) bool { got = append(got, e); return true })
	if err != nil || bad != 2 || len(got) != 5 {
		t.Fatalf("entries=%d bad=%d err=%v", len(got), bad, err)
	}
	want := []UnixEntry{
		{Flags: 0x10000, Type: 1, State: 1, Inode: 100, Path: "/run/pg/.s.PGSQL.5432"},
		{Type: 1, State: 3, Inode: 101, Path: "/run/pg/.s.PGSQL.5432"},
		{Type: 1, State: 3, Inode: 102},
		{Type: 2, State: 1, Inode: 103, Path: "@abstract name with spaces"},
		{Type: 5, State: 1, Inode: 104},
	}
	for i, w := range want {
		if got[i] != w {
			t.Errorf("%d: %+v, want %+v", i, got[i], w)
		}
	}
	if !got[0].Listening() || got[1].Listening() {
		t.Errorf("Listening: %v %v, want true false", got[0].Listening(), got[1].Listening())
	}
	if TypeName(got[3].Type) != "dgram" || TypeName(9) != "type9" {
		t.Errorf("TypeName: %q %q", TypeName(got[3].Type), TypeName(9))
	}
}

func TestScanNetUnixStopsWhenAsked(t *testing.T) {
	n := 0
	if _, err := ScanNetUnix(strings.NewReader(recorded), func(UnixEntry) bool { n++; return n < 2 }); err != nil || n != 2 {
		t.Fatalf("n=%d err=%v, want a stop after 2", n, err)
	}
}

// A line beyond MaxNetUnixLine is an error, not unbounded memory.
func TestScanNetUnixLineCap(t *testing.T) {
	long := "0: 1 0 10000 1 1 7 /" + strings.Repeat("x", MaxNetUnixLine) + "\n"
	if _, err := ScanNetUnix(strings.NewReader(long), func(UnixEntry) bool { return true }); err == nil {
		t.Fatal("a line longer than MaxNetUnixLine was accepted")
	}
}

func FuzzScanNetUnix(f *testing.F) {
	f.Add(recorded)
	f.Add("Num\n0: 1 2 3 4 5 6\n")
	f.Add("0: 1 2 10000 1 1 5 \t path\n")
	f.Fuzz(func(t *testing.T, s string) {
		ScanNetUnix(strings.NewReader(s), func(e UnixEntry) bool {
			if e.Path != "" && (strings.ContainsRune(e.Path, '\n') || e.Path[0] == ' ') {
				t.Fatalf("path %q kept a separator", e.Path)
			}
			return true
		})
	})
}
