package main

import (
	"bufio"
	"encoding/binary"
	"errors"
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
	"syscall"
	"time"

	"github.com/udskit/udskit/internal/stats"
)

// -recipes: udskit's recording side by side with what people use today to
// see a unix socket's bytes, on one connection streaming -size bytes in
// -chunk writes (64 KiB by default here) from a client process into this
// process's server, every variant recording to a file in -file-dir:
//
//	direct         client --unix--> server (no recording: the reference)
//	capture        udskit capture SERVER -w FILE: interposed on the server's path
//	kernel         udskit capture --kernel SERVER -w FILE (eBPF; root only)
//	socat+tcpdump  the man-in-the-middle recipe: socat UNIX-LISTEN -> TCP on
//	               127.0.0.1 -> socat -> the server, tcpdump -i lo -w FILE on that port
//	strace         strace -f -e trace=write -e write=all -o FILE on the client
//	               (the recipe's full hex dump of every write)
//
// The client is this program re-executed (so strace can trace it); it times
// its own stream and the server's count of the bytes is checked. "recorded"
// is the share of the payload found in the file: for tcpdump the TCP
// payload toward the server in its pcap, for strace the bytes of its hex
// dumps, for udskit what it reports (interposition records every byte or
// stops the traffic; the kernel mode reports its losses).

const clientEnv = "UDSKIT_BENCHCAPTURE_CLIENT" // ADDR,SIZE,CHUNK: run as the client

// runClientChild is the re-executed client: it streams and prints the
// seconds it took.
func runClientChild(spec string) {
	parts := strings.Split(spec, ",")
	if len(parts) != 3 {
		fail(fmt.Errorf("%s=%q: want ADDR,SIZE,CHUNK", clientEnv, spec))
	}
	size, err1 := strconv.ParseInt(parts[1], 10, 64)
	chunk, err2 := strconv.Atoi(parts[2])
	if err := errors.Join(err1, err2); err != nil {
		fail(err)
	}
	start := time.Now()
	if err := stream(parts[0], size, chunk); err != nil {
		fail(err)
	}
	fmt.Printf("%.6f\n", time.Since(start).Seconds())
}

type recipeSample struct {
	mbps     float64
	recorded float64 // share of the payload in the file; -1: not applicable
	file     int64   // bytes of the recording
	note     string
}

func runRecipes(bin, dir, srv string, rounds int, size int64, chunk int) {
	variants := []string{"direct", "capture", "socat+tcpdump", "strace"}
	if os.Geteuid() == 0 {
		variants = slices.Insert(variants, 2, "kernel")
	} else {
		fmt.Println("not root: the kernel variant (udskit capture --kernel) is left out")
	}
	self, err := os.Executable()
	if err != nil {
		fail(err)
	}
	fmt.Printf("recipes: one connection streams %d MiB in %d KiB writes, %d rounds, variants %v, files in %s\n",
		size>>20, chunk>>10, rounds, variants, *fileDir)
	res := map[string][]recipeSample{}
	for r := range rounds {
		order := slices.Clone(variants)
		for range r % len(order) {
			order = append(order[1:], order[0])
		}
		for _, v := range order {
			s, err := runRecipe(v, self, bin, dir, srv, size, chunk)
			if err != nil {
				fail(fmt.Errorf("round %d %s: %w", r+1, v, err))
			}
			res[v] = append(res[v], s)
			rec := "-"
			if s.recorded >= 0 {
				rec = fmt.Sprintf("%.2f%%", 100*s.recorded)
			}
			fmt.Printf("round %d %-14s %6.0f MB/s  recorded %8s  file %5d MB  %s\n", r+1, v, s.mbps, rec, s.file/1_000_000, s.note)
		}
	}
	fmt.Println()
	fmt.Println("| variant | MB/s (median) | min-max | x direct | x socat+tcpdump | payload recorded (min) |")
	fmt.Println("|---|---|---|---|---|---|")
	med := func(v string) float64 {
		var xs []float64
		for _, s := range res[v] {
			xs = append(xs, s.mbps)
		}
		return stats.Median(xs)
	}
	for _, v := range variants {
		var xs []float64
		rec := 2.0
		for _, s := range res[v] {
			xs = append(xs, s.mbps)
			if s.recorded >= 0 {
				rec = min(rec, s.recorded)
			}
		}
		rs := "-"
		if rec <= 1 {
			rs = fmt.Sprintf("%.2f%%", 100*rec)
		}
		fmt.Printf("| %s | %.0f | %.0f-%.0f | %.2fx | %.2fx | %s |\n", v, med(v), slices.Min(xs), slices.Max(xs),
			med(v)/med("direct"), med(v)/med("socat+tcpdump"), rs)
	}
}

func runRecipe(v, self, bin, dir, srv string, size int64, chunk int) (recipeSample, error) {
	s := recipeSample{recorded: -1}
	file := filepath.Join(*fileDir, "recipe-"+strings.ReplaceAll(v, "+", "-"))
	defer os.Remove(file)
	target := srv
	var procs []*exec.Cmd
	var logs []*logBuf
	stopAll := func() {
		for _, p := range procs {
			if p.ProcessState == nil {
				p.Process.Signal(syscall.SIGINT)
				waitOrKill(p, 10*time.Second)
			}
		}
	}
	defer stopAll()
	start := func(marker string, name string, args ...string) (*logBuf, error) {
		c := exec.Command(name, args...)
		lb := &logBuf{ready: make(chan struct{}), marker: marker}
		c.Stderr = lb
		if err := c.Start(); err != nil {
			return nil, fmt.Errorf("%s: %w (scripts/install-deps.sh installs it)", name, err)
		}
		procs = append(procs, c)
		logs = append(logs, lb)
		if err := waitReady(name, lb.ready); err != nil {
			return nil, fmt.Errorf("%w: %s", err, lb.String())
		}
		return lb, nil
	}
	var port int
	switch v {
	case "capture":
		if _, err := start("capture: interposed on", bin, "capture", srv, "-w", file, "--drain-timeout", "1s"); err != nil {
			return s, err
		}
	case "kernel":
		if _, err := start("recording", bin, "capture", "--kernel", srv, "-w", file); err != nil {
			return s, err
		}
	case "socat+tcpdump":
		var err error
		if port, err = freePort(); err != nil {
			return s, err
		}
		if _, err := start("listening on", "tcpdump", "-i", "lo", "-n", "-w", file, "tcp", "port", strconv.Itoa(port)); err != nil {
			return s, err
		}
		if _, err := start("listening on", "socat", "-d", "-d", "-t", "5",
			fmt.Sprintf("TCP-LISTEN:%d,bind=127.0.0.1,reuseaddr,fork", port), "UNIX-CONNECT:"+srv); err != nil {
			return s, err
		}
		target = frontSock(dir, "socat")
		if _, err := start("listening on", "socat", "-d", "-d", "-t", "5",
			"UNIX-LISTEN:"+target+",fork", fmt.Sprintf("TCP-CONNECT:127.0.0.1:%d", port)); err != nil {
			return s, err
		}
	}
	client := exec.Command(self)
	if v == "strace" {
		client = exec.Command("strace", "-f", "-qq", "-o", file, "-e", "trace=write", "-e", "write=all", self)
	}
	client.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d,%d", clientEnv, target, size, chunk))
	client.Stderr = os.Stderr
	out, err := client.Output()
	if err != nil {
		return s, fmt.Errorf("client: %w", err)
	}
	secs, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
	if err != nil || secs <= 0 {
		return s, fmt.Errorf("client printed %q", out)
	}
	s.mbps = float64(size) / secs / 1e6
	if v == "socat+tcpdump" {
		time.Sleep(300 * time.Millisecond) // the last packets reach tcpdump's buffer
	}
	stopAll()
	if fi, err := os.Stat(file); err == nil {
		s.file = fi.Size()
	}
	switch v {
	case "capture":
		s.recorded = 1 // interposition stops the traffic rather than drop a byte
		if m := droppedRe.FindStringSubmatch(logs[0].String()); m != nil {
			d, _ := strconv.ParseInt(m[1], 10, 64)
			s.recorded = 1 - float64(d)/float64(size)
		}
	case "kernel":
		m := kernelBytesRe.FindStringSubmatch(logs[0].String())
		if m == nil {
			return s, fmt.Errorf("no byte count in the kernel capture's summary: %s", logs[0].String())
		}
		n, _ := strconv.ParseInt(m[1], 10, 64)
		s.recorded = min(1, float64(n)/float64(size))
		if m := kernelLossRe.FindStringSubmatch(logs[0].String()); m != nil {
			s.note = "kernel drop rate " + m[1] + "%"
		}
	case "socat+tcpdump":
		n, err := pcapPayloadTo(file, port)
		if err != nil {
			return s, err
		}
		s.recorded = float64(n) / float64(size)
		if m := tcpdumpDropRe.FindStringSubmatch(logs[0].String()); m != nil {
			s.note = "tcpdump: " + m[0]
		}
	case "strace":
		n, err := straceDumped(file)
		if err != nil {
			return s, err
		}
		s.recorded = min(1, float64(n)/float64(size))
	}
	return s, nil
}

var (
	kernelBytesRe = regexp.MustCompile(`messages, (\d+) bytes;`)
	kernelLossRe  = regexp.MustCompile(`([0-9.]+)% of the data bytes`)
	tcpdumpDropRe = regexp.MustCompile(`\d+ packets? dropped by kernel`)
)

func waitOrKill(c *exec.Cmd, d time.Duration) {
	done := make(chan struct{})
	go func() { c.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		c.Process.Kill()
		<-done
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// pcapPayloadTo sums the TCP payload bytes sent to port in a classic pcap
// file of Ethernet frames (tcpdump -i lo -w), counting only what was
// captured (caplen).
func pcapPayloadTo(file string, port int) (int64, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	var gh [24]byte
	if _, err := io.ReadFull(r, gh[:]); err != nil {
		return 0, fmt.Errorf("%s: pcap header: %w", file, err)
	}
	var le binary.ByteOrder = binary.LittleEndian
	switch binary.LittleEndian.Uint32(gh[:]) {
	case 0xa1b2c3d4, 0xa1b23c4d:
	case 0xd4c3b2a1, 0x4d3cb2a1:
		le = binary.BigEndian
	default:
		return 0, fmt.Errorf("%s: not a pcap file", file)
	}
	var total int64
	buf := make([]byte, 0, 1<<16)
	for {
		var rh [16]byte
		if _, err := io.ReadFull(r, rh[:]); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return total, nil // tcpdump stopped mid-record at worst
			}
			return 0, err
		}
		caplen := int(le.Uint32(rh[8:]))
		if caplen > 1<<20 {
			return 0, fmt.Errorf("%s: record of %d bytes", file, caplen)
		}
		buf = slices.Grow(buf[:0], caplen)[:caplen]
		if _, err := io.ReadFull(r, buf); err != nil {
			return total, nil
		}
		// Ethernet (14) + IPv4 (IHL) + TCP (data offset).
		if caplen < 14+20+20 || binary.BigEndian.Uint16(buf[12:]) != 0x0800 {
			continue
		}
		ip := buf[14:]
		ihl := int(ip[0]&0x0f) * 4
		if ip[9] != 6 || len(ip) < ihl+20 {
			continue
		}
		tcp := ip[ihl:]
		if int(binary.BigEndian.Uint16(tcp[2:])) != port {
			continue
		}
		doff := int(tcp[12]>>4) * 4
		if len(tcp) >= doff {
			total += int64(len(tcp) - doff)
		}
	}
}

// straceDumped counts the bytes in strace's hex dumps (-e write=...):
// lines " | 00000  68 65 6c 6c 6f  hello |", up to 16 bytes each.
func straceDumped(file string) (int64, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	var total int64
	for sc.Scan() {
		l := sc.Bytes()
		i := strings.Index(string(l[:min(len(l), 32)]), " | ")
		if i < 0 || len(l) < i+10+49 {
			continue
		}
		// " | " offset(5) "  " then 16 hex bytes in 49 columns.
		for _, tok := range strings.Fields(string(l[i+10 : i+10+49])) {
			if len(tok) == 2 {
				total++
			}
		}
	}
	return total, sc.Err()
}
