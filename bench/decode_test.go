package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func frameBytes(p []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(p)))
	return append(b, p...)
}

func TestReadFrame(t *testing.T) {
	var hdr [4]byte
	p, err := readFrame(bytes.NewReader(frameBytes([]byte("hello"))), &hdr, nil, 16)
	if err != nil || string(p) != "hello" {
		t.Fatalf("got %q, %v", p, err)
	}
	big := binary.BigEndian.AppendUint32(nil, 17)
	if _, err := readFrame(bytes.NewReader(big), &hdr, nil, 16); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("17-byte frame with cap 16: err %v, want ErrFrameTooLarge", err)
	}
	short := frameBytes([]byte("hello"))[:6]
	if _, err := readFrame(bytes.NewReader(short), &hdr, nil, 16); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated frame: err %v, want ErrUnexpectedEOF", err)
	}
}

func FuzzReadFrame(f *testing.F) {
	f.Add(frameBytes([]byte("hello")))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1})
	f.Add([]byte{0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var hdr [4]byte
		const max = 1 << 12
		r := bytes.NewReader(b)
		var buf []byte
		for {
			p, err := readFrame(r, &hdr, buf, max)
			if err != nil {
				return
			}
			if len(p) > max {
				t.Fatalf("frame of %d bytes over the cap", len(p))
			}
			buf = p
		}
	})
}

func TestParseStats(t *testing.T) {
	s, err := ParseStats(`{"mallocs":12,"user_ns":5,"sys_ns":7}`)
	if err != nil || s.Mallocs != 12 || s.CPU() != 12 {
		t.Fatalf("got %+v, %v", s, err)
	}
	for _, bad := range []string{"", "{", `{"mallocs":-1}`, `{"user_ns":-5}`, `{"x":1}`, strings.Repeat(" ", maxCtlLine+1)} {
		if _, err := ParseStats(bad); err == nil {
			t.Errorf("ParseStats(%.20q) accepted", bad)
		}
	}
}

func FuzzParseStats(f *testing.F) {
	f.Add(`{"mallocs":12,"user_ns":5,"sys_ns":7}`)
	f.Add(`{"mallocs":1e30}`)
	f.Fuzz(func(t *testing.T, s string) {
		st, err := ParseStats(s)
		if err == nil && (st.UserNS < 0 || st.SysNS < 0) {
			t.Fatalf("accepted negative CPU: %+v", st)
		}
	})
}

func FuzzReadLine(f *testing.F) {
	f.Add([]byte("stats\n"))
	f.Add(bytes.Repeat([]byte("x"), 9000))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bufio.NewReaderSize(bytes.NewReader(b), 16)
		for {
			l, err := readLine(r, 64)
			if err != nil {
				return
			}
			if len(l) > 64 {
				t.Fatalf("line of %d bytes over the cap", len(l))
			}
		}
	})
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int{"1024": 1024, "1k": 1024, "1KiB": 1024, "10kb": 10240, "100KiB": 102400, "1m": 1 << 20, "1MiB": 1 << 20, "3b": 3} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "-1", "x", "1g", "65MiB", "1.5k"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
	for _, n := range []int{1, 1000, 1024, 10240, 1 << 20} {
		if got, err := ParseSize(FormatSize(n)); err != nil || got != n {
			t.Errorf("FormatSize(%d)=%q does not parse back: %d %v", n, FormatSize(n), got, err)
		}
	}
}

// TestRawEchoAllocFree checks the raw baseline allocates nothing per request
// on the client, so its allocs/req column is a true zero.
func TestRawEchoAllocFree(t *testing.T) {
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "raw.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveRaw(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	tr, _ := Lookup("raw-unix")
	cl, err := tr.Dial(ctx, "unix", ln.Addr().String(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	p := Payload(4096)
	resp, err := cl.Callers[0].Call(ctx, p)
	if err != nil || !bytes.Equal(resp, p) {
		t.Fatalf("echo: %v, equal=%v", err, bytes.Equal(resp, p))
	}
	if n := testing.AllocsPerRun(200, func() { cl.Callers[0].Call(ctx, p) }); n != 0 {
		t.Errorf("raw echo client: %v allocs per call, want 0", n)
	}
}

func TestServeMainBadFlags(t *testing.T) {
	var out, errb bytes.Buffer
	if code := ServeMain(context.Background(), []string{"--transport", "nope", "--addr", "x", "--ctl", "y"}, nil, &out, &errb); code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	if !strings.Contains(errb.String(), `unknown transport "nope"`) || !strings.Contains(errb.String(), "raw-unix") {
		t.Errorf("stderr %q does not name the bad transport and the available ones", errb.String())
	}
}

func TestRunConfigErrors(t *testing.T) {
	base := testConfig(t)
	cases := map[string]func(*Config){
		"unknown transport": func(c *Config) { c.Transports = []string{"carrier-pigeon"} },
		"size":              func(c *Config) { c.Sizes = []int{0} },
		"concurrency":       func(c *Config) { c.Conc = []int{-1} },
		"ServerCmd":         func(c *Config) { c.ServerCmd = nil },
	}
	for want, mod := range cases {
		cfg := base
		mod(&cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := Run(ctx, cfg)
		cancel()
		if err == nil || !strings.Contains(err.Error(), strings.Split(want, " ")[0]) {
			t.Errorf("%s: err %v", want, err)
		}
	}
}

func TestFixedRateCountsFromIntendedTime(t *testing.T) {
	cfg := testConfig(t)
	cfg.Transports = []string{"raw-unix"}
	cfg.Sizes = []int{512}
	cfg.Conc = []int{2}
	cfg.Rate = 500
	cfg.Duration = 200 * time.Millisecond
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := rep.Cells[0]
	if c.Requests != 100 {
		t.Fatalf("fixed rate 500/s for 200ms: %d requests, want 100", c.Requests)
	}
	// At 500 req/s the run cannot be faster than the schedule.
	if c.RPS > 560 {
		t.Errorf("fixed rate 500/s measured %.0f req/s: not paced", c.RPS)
	}
}

func TestParseNDJSONEcho(t *testing.T) {
	for _, tc := range []struct {
		line string
		id   uint64
		want string
		err  string
	}{
		{`{"id":7,"data":"abc"}`, 7, "abc", ""},
		{`{"id":7, "data": "a\"b"}`, 7, `a"b`, ""},
		{`{"id":8,"data":"abc"}`, 7, "", "response id 8"},
		{`{"id":7,"error":"nope","code":"not_found"}`, 7, "", "not_found: nope"},
		{`{"id":7,"data":{"x":1}}`, 7, "", "not a string"},
		{`{"id":7,"data":"abc`, 7, "", "bad response"},
	} {
		got, err := parseNDJSONEcho([]byte(tc.line), tc.id)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err %v, want %q", tc.line, err, tc.err)
			}
			continue
		}
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: got %q, %v; want %q", tc.line, got, err, tc.want)
		}
	}
}

func FuzzParseNDJSONEcho(f *testing.F) {
	f.Add([]byte(`{"id":1,"data":"abc"}`), uint64(1))
	f.Add([]byte(`{"id":1,"error":"x","code":"y"}`), uint64(1))
	f.Fuzz(func(t *testing.T, line []byte, id uint64) {
		got, err := parseNDJSONEcho(line, id)
		if err == nil && len(got) > len(line) {
			t.Fatalf("echo of %d bytes from a %d-byte line", len(got), len(line))
		}
	})
}

func FuzzReadLineBytes(f *testing.F) {
	f.Add([]byte("{\"id\":1}\n{\"id\":2}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bufio.NewReaderSize(bytes.NewReader(b), 16)
		var line []byte
		for {
			l, err := readLineBytes(r, line[:0], 100)
			if err != nil {
				return
			}
			if len(l) > 100 {
				t.Fatalf("line of %d bytes over the cap", len(l))
			}
			line = l
		}
	})
}
