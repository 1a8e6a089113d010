// Command udskit-benchcapture measures `udskit capture` (interposed relay recording
// every byte to a pcapng file) side by side with `udskit proxy` (no capture)
// on the same unix -> unix path, in one run:
//
//	go run ./tools/benchcapture                     # 5 rounds of 1 GiB, file in $TMPDIR
//	go run ./tools/benchcapture -file-dir /dev/shm  # the capture file on tmpfs
//	go run ./tools/benchcapture -recipes            # against socat+tcpdump and strace (recipes.go)
//
// Topology: this process runs a unix-socket server that reads everything and
// answers with the byte count, and the client. Variants, each a separate
// udskit process built from this checkout:
//
//	proxy      client --unix--> udskit proxy --unix--> server   (splice)
//	proxy-copy the same with --no-splice: the copy path a capture uses
//	capture    client --unix--> udskit capture -w FILE --> server (interposed on the server's path)
//	capture-drop  the same with --drop (a background writer; payloads left out if the disk falls behind)
//	capture-alt   capture with the -alt-bin binary (a baseline build), when given
//	direct     client --unix--> server                          (reference)
//	file-write this process writes -size bytes to a file in -file-dir in
//	           -chunk writes: the ceiling for recording everything
//
// One connection streams -size bytes in -chunk writes, half-closes, and
// waits for the server's count (checked). Rounds are interleaved and the
// order rotates; the table has medians, the capture/proxy ratio is taken per
// round, and the peak RSS (VmHWM) and CPU time (utime+stime, per GiB) of
// the udskit process are read from /proc before it stops. The capture file is removed after each round.
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/udskit/udskit/internal/proc"
	"github.com/udskit/udskit/internal/stats"
)

var (
	fileDir *string
	altBin  string
)

func main() {
	if spec := os.Getenv(clientEnv); spec != "" {
		runClientChild(spec)
		return
	}
	rounds := flag.Int("rounds", 5, "rounds; each runs every variant once (order rotated)")
	sizeS := flag.String("size", "1GiB", "bytes streamed per sample (KiB, MiB, GiB suffixes)")
	chunk := flag.Int("chunk", 256<<10, "client write size")
	fileDir = flag.String("file-dir", os.TempDir(), "directory of the capture file (its disk bounds what can be recorded)")
	bin := flag.String("bin", "", "udskit binary (default: go build ./cmd/udskit into a temp dir)")
	flag.StringVar(&altBin, "alt-bin", "", "another udskit binary (a baseline build): adds the variant capture-alt, its capture")
	recipes := flag.Bool("recipes", false, "instead: udskit capture (interposed), udskit capture --kernel (as root), the socat+tcpdump recipe and strace, side by side with direct (size 512MiB and chunk 64KiB unless given)")
	flag.Parse()
	if *recipes {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["size"] {
			*sizeS = "512MiB"
		}
		if !set["chunk"] {
			*chunk = 64 << 10
		}
	}
	size, err := parseSize(*sizeS)
	if err != nil {
		fail(err)
	}
	dir, err := os.MkdirTemp("", "capbench-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	if *bin == "" {
		*bin = filepath.Join(dir, "udskit")
		out, err := exec.Command("go", "build", "-o", *bin, "./cmd/udskit").CombinedOutput()
		if err != nil {
			fail(fmt.Errorf("go build ./cmd/udskit (run from the repository root): %v\n%s", err, out))
		}
	}
	srv := filepath.Join(dir, "server.sock")
	l, err := net.Listen("unix", srv)
	if err != nil {
		fail(err)
	}
	go serve(l)
	if *recipes {
		runRecipes(*bin, dir, srv, *rounds, size, *chunk)
		return
	}

	variants := []string{"proxy", "proxy-copy", "capture", "capture-drop", "direct", "file-write"}
	if altBin != "" {
		variants = append(variants, "capture-alt")
	}
	res := map[string][]sample{}
	var ratios, ratiosND, ratiosCopy, ratiosAlt []float64
	fmt.Printf("streaming %s per sample, %d rounds, variants %v\n", *sizeS, *rounds, variants)
	for r := range *rounds {
		order := slices.Clone(variants)
		for range r % len(order) {
			order = append(order[1:], order[0])
		}
		got := map[string]sample{}
		for _, v := range order {
			s, err := runVariant(v, *bin, dir, srv, size, *chunk)
			if err != nil {
				fail(fmt.Errorf("round %d %s: %w", r+1, v, err))
			}
			got[v] = s
			res[v] = append(res[v], s)
			fmt.Printf("round %d %-14s %6.0f MB/s  peak RSS %5.1f MiB  CPU %4.0f ms/GiB  capture file %5d MB, %3.0f%% of the payload\n", r+1, v, s.mbps, float64(s.rssKiB)/1024, s.cpuMs, s.fileBytes/1_000_000, 100*s.recorded)
		}
		ratios = append(ratios, got["capture"].mbps/got["proxy"].mbps)
		ratiosND = append(ratiosND, got["capture-drop"].mbps/got["proxy"].mbps)
		ratiosCopy = append(ratiosCopy, got["capture"].mbps/got["proxy-copy"].mbps)
		if altBin != "" {
			ratiosAlt = append(ratiosAlt, got["capture"].mbps/got["capture-alt"].mbps)
		}
	}
	fmt.Println()
	fmt.Println("| variant | MB/s (median) | min-max | payload recorded (median) | peak RSS of the udskit process (max) | its CPU ms per GiB (median) |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, v := range variants {
		var mb, rec, cpu []float64
		var rss int64
		for _, s := range res[v] {
			mb = append(mb, s.mbps)
			cpu = append(cpu, s.cpuMs)
			rec = append(rec, s.recorded)
			rss = max(rss, s.rssKiB)
		}
		rs, rc, cs := "-", "-", "-"
		if strings.HasPrefix(v, "proxy") || strings.HasPrefix(v, "capture") {
			rs = fmt.Sprintf("%.1f MiB", float64(rss)/1024)
			cs = fmt.Sprintf("%.0f", stats.Median(cpu))
		}
		if strings.HasPrefix(v, "capture") {
			rc = fmt.Sprintf("%.0f%%", 100*stats.Median(rec))
		}
		fmt.Printf("| %s | %.0f | %.0f-%.0f | %s | %s | %s |\n", v, stats.Median(mb), slices.Min(mb), slices.Max(mb), rc, rs, cs)
	}
	fmt.Printf("\ncapture / proxy throughput, per round: %s; median %.2fx\n", fmtList(ratios), stats.Median(ratios))
	fmt.Printf("capture / proxy --no-splice, per round: %s; median %.2fx\n", fmtList(ratiosCopy), stats.Median(ratiosCopy))
	fmt.Printf("capture --drop / proxy, per round: %s; median %.2fx\n", fmtList(ratiosND), stats.Median(ratiosND))
	if altBin != "" {
		fmt.Printf("capture / capture-alt, per round: %s; median %.2fx\n", fmtList(ratiosAlt), stats.Median(ratiosAlt))
	}
}

var droppedRe = regexp.MustCompile(`capture: (\d+) payload bytes were left out`)

type sample struct {
	recorded  float64 // share of the payload bytes in the file
	mbps      float64
	rssKiB    int64
	fileBytes int64
	cpuMs     float64 // CPU time (user+system) of the udskit process per GiB
}

func runVariant(v, bin, dir, srv string, size int64, chunk int) (sample, error) {
	target := srv
	var cmd *exec.Cmd
	file := filepath.Join(*fileDir, "capbench.pcapng")
	switch v {
	case "proxy":
		target = frontSock(dir, v)
		cmd = exec.Command(bin, "proxy", "--listen", target, "--to", srv, "--log-level", "info")
	case "proxy-copy":
		target = frontSock(dir, v)
		cmd = exec.Command(bin, "proxy", "--listen", target, "--to", srv, "--log-level", "info", "--no-splice")
	case "capture":
		cmd = exec.Command(bin, "capture", srv, "-w", file, "--drain-timeout", "1s")
	case "capture-drop":
		cmd = exec.Command(bin, "capture", srv, "-w", file, "--drain-timeout", "1s", "--drop")
	case "capture-alt":
		cmd = exec.Command(altBin, "capture", srv, "-w", file, "--drain-timeout", "1s")
	}
	var s sample
	if v == "file-write" {
		return fileWrite(file, size, chunk)
	}
	marker := "proxy listening"
	if strings.HasPrefix(v, "capture") {
		marker = "capture: interposed on"
	}
	errb := &logBuf{ready: make(chan struct{}), marker: marker}
	if cmd != nil {
		cmd.Stderr = errb
		if err := cmd.Start(); err != nil {
			return s, err
		}
		defer os.Remove(file)
		defer func() {
			if cmd.ProcessState == nil {
				cmd.Process.Kill()
				cmd.Wait()
			}
		}()
		if err := waitReady(v, errb.ready); err != nil {
			cmd.Process.Kill()
			return s, fmt.Errorf("%w: %s", err, errb.String())
		}
	}
	start := time.Now()
	if err := stream(target, size, chunk); err != nil {
		return s, err
	}
	s.mbps = float64(size) / time.Since(start).Seconds() / 1e6
	if cmd != nil {
		s.rssKiB = vmHWM(cmd.Process.Pid)
		s.cpuMs = cpuMillis(cmd.Process.Pid) * float64(1<<30) / float64(size)
		cmd.Process.Signal(syscall.SIGINT)
		cmd.Wait()
	}
	if strings.HasPrefix(v, "capture") {
		fi, err := os.Stat(file)
		if err != nil {
			return s, err
		}
		s.fileBytes = fi.Size()
		s.recorded = 1
		if m := droppedRe.FindStringSubmatch(errb.String()); m != nil {
			d, _ := strconv.ParseInt(m[1], 10, 64)
			s.recorded = 1 - float64(d)/float64(size)
		}
	}
	return s, nil
}

var started int

// frontSock is a fresh listen path for each proxy process: a previous
// round's proxy, still shutting down (its Close probes and unlinks its own
// socket path), must not be able to touch the path the next one listens on.
// One shared path raced: a round dialed the path the old process was
// cleaning up and failed with ENOENT.
func frontSock(dir, v string) string {
	started++
	return filepath.Join(dir, fmt.Sprintf("front-%s-%d.sock", v, started))
}

// logBuf collects a udskit process's stderr and closes ready at the first
// line holding marker.
type logBuf struct {
	mu     sync.Mutex
	b      strings.Builder
	marker string
	ready  chan struct{}
	seen   bool
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Write(p)
	if !l.seen && strings.Contains(l.b.String(), l.marker) {
		l.seen = true
		close(l.ready)
	}
	return len(p), nil
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitReady waits for the process's ready line: "proxy listening", or the
// capture's "interposed on". Neither a successful dial (a round then got
// ECONNREFUSED) nor the server path's inode changing (a fast capture had
// already swapped it before the first look) was reliable.
func waitReady(v string, ready <-chan struct{}) error {
	select {
	case <-ready:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New(v + " did not start")
	}
}

func stream(addr string, size int64, chunk int) error {
	c, err := net.Dial("unix", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, chunk)
	for i := range buf {
		buf[i] = byte(i * 31)
	}
	for left := size; left > 0; {
		n := min(int64(len(buf)), left)
		if _, err := c.Write(buf[:n]); err != nil {
			return err
		}
		left -= n
	}
	c.(*net.UnixConn).CloseWrite()
	var got [8]byte
	if _, err := io.ReadFull(c, got[:]); err != nil {
		return err
	}
	if n := int64(binary.LittleEndian.Uint64(got[:])); n != size {
		return fmt.Errorf("server counted %d bytes, sent %d", n, size)
	}
	return nil
}

// fileWrite is the file's ceiling: size bytes in chunk writes, timed like
// the capture (the close, which may start writeback, is not timed).
func fileWrite(file string, size int64, chunk int) (sample, error) {
	f, err := os.Create(file)
	if err != nil {
		return sample{}, err
	}
	defer os.Remove(file)
	buf := make([]byte, chunk)
	start := time.Now()
	for left := size; left > 0; {
		n := min(int64(len(buf)), left)
		if _, err := f.Write(buf[:n]); err != nil {
			f.Close()
			return sample{}, err
		}
		left -= n
	}
	mbps := float64(size) / time.Since(start).Seconds() / 1e6
	if err := f.Close(); err != nil {
		return sample{}, err
	}
	return sample{mbps: mbps}, nil
}

func serve(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			n, _ := io.CopyBuffer(io.Discard, c, make([]byte, 256<<10))
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], uint64(n))
			c.Write(b[:])
		}()
	}
}

// cpuMillis is the process's CPU time so far (utime+stime) in ms.
func cpuMillis(pid int) float64 {
	st, _ := proc.ReadStat(pid)
	return float64(st.CPU()) / float64(time.Millisecond)
}

// vmHWM is the process's peak resident set size in KiB.
func vmHWM(pid int) int64 {
	kb, _ := proc.StatusKB(pid, "VmHWM")
	return kb
}

func parseSize(s string) (int64, error) {
	mult := int64(1)
	for suf, m := range map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if strings.HasSuffix(s, suf) {
			s, mult = strings.TrimSuffix(s, suf), m
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("-size %q: want a positive number with an optional KiB/MiB/GiB suffix", s)
	}
	return n * mult, nil
}

func fmtList(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.2fx", x)
	}
	return strings.Join(parts, " ")
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "capturebench:", err)
	os.Exit(1)
}
