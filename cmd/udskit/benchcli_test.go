package main

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBenchTinyRun runs `udskit bench` end to end (server re-exec included)
// with a tiny duration over every transport family and checks the table, the
// JSON and the chart.
func TestBenchTinyRun(t *testing.T) {
	dir := t.TempDir()
	js, svg := filepath.Join(dir, "r.json"), filepath.Join(dir, "c.svg")
	transports := []string{"rpc-unix", "grpc-unix", "raw-unix", "raw-tcp", "ndjson-unix"}
	r := scRun(t, "", "bench", "--transports", strings.Join(transports, ","), "--sizes", "1k,64k",
		"--conc", "1,2", "--duration", "60ms", "--warmup", "30ms", "--json", js, "--chart", svg)
	if r.code != 0 {
		t.Fatalf("bench: exit %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"kernel", "clocksource", "CPU ", "cores", "go1.", "vs grpc", "vs raw", "p99.9", "allocs/req", "cpu µs/req"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, r.stdout)
		}
	}
	rows := 0
	for _, l := range strings.Split(r.stdout, "\n") {
		f := strings.Fields(l)
		for _, tr := range transports {
			if len(f) > 3 && f[0] == tr {
				rows++
				if f[3] == "0" {
					t.Errorf("row with 0 req/s: %s", l)
				}
			}
		}
	}
	if rows != len(transports)*2*2 {
		t.Errorf("table has %d transport rows, want %d:\n%s", rows, len(transports)*4, r.stdout)
	}
	if !strings.Contains(r.stderr, "step 40/40") || !strings.Contains(r.stderr, "ETA") {
		t.Errorf("no progress lines on stderr: %s", r.stderr)
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		System map[string]any
		Cells  []struct {
			Transport string
			Size      int
			Conc      int
			Requests  int64
			RPS       float64 `json:"rps"`
			P99       float64 `json:"p99_us"`
			VsGRPC    float64 `json:"vs_grpc"`
			CliAllocs float64 `json:"client_allocs_per_req"`
			SrvAllocs float64 `json:"server_allocs_per_req"`
			CliCPU    float64 `json:"client_cpu_s"`
			SrvCPU    float64 `json:"server_cpu_s"`
		}
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("--json output: %v", err)
	}
	if len(rep.Cells) != 20 || rep.System["clocksource"] == nil {
		t.Fatalf("--json has %d cells (want 20), system %v", len(rep.Cells), rep.System)
	}
	var cliCPU, srvCPU float64
	for _, c := range rep.Cells {
		if c.RPS <= 0 || c.P99 <= 0 || c.Requests < 1 {
			t.Errorf("cell %+v has no measurements", c)
		}
		if c.Transport == "rpc-unix" && c.VsGRPC <= 0 {
			t.Errorf("rpc-unix cell without a ratio to grpc-unix: %+v", c)
		}
		// grpc-go allocates dozens of objects per call on each side: the
		// server's count must come from the server process's own counters.
		if c.Transport == "grpc-unix" && (c.CliAllocs < 5 || c.SrvAllocs < 5) {
			t.Errorf("grpc-unix allocs/req client %.1f server %.1f: want both well above 0", c.CliAllocs, c.SrvAllocs)
		}
		cliCPU += c.CliCPU
		srvCPU += c.SrvCPU
	}
	if cliCPU <= 0 || srvCPU <= 0 {
		t.Errorf("CPU seconds over all cells: client %v server %v, want both > 0", cliCPU, srvCPU)
	}
	f, err := os.Open(svg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var doc struct {
		XMLName xml.Name
		Rects   []struct{} `xml:"rect"`
	}
	if err := xml.NewDecoder(f).Decode(&doc); err != nil || doc.XMLName.Local != "svg" {
		t.Fatalf("chart is not an SVG document: %v %v", doc.XMLName, err)
	}
	// 20 cells x 2 panels + background + legend swatches
	if want := 20*2 + 1 + len(transports); len(doc.Rects) != want {
		t.Errorf("chart has %d rects, want %d", len(doc.Rects), want)
	}
}

// A size over the 64 MiB cap is refused up front (exit 2, the cap named).
func TestBenchSizeOverCap(t *testing.T) {
	_, err := runCLI(t, "bench", "--transports", "raw-unix,grpc-tcp", "--sizes", "1k,65m")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(err.Error(), "64MiB cap") {
		t.Errorf("--sizes 65m: %v, want exit 2 naming the 64MiB cap", err)
	}
}
