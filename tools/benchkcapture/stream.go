//go:build linux

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/udskit/udskit/kcapture"
	"github.com/udskit/udskit/pcapng"
	"github.com/udskit/udskit/record"
)

// streamOpts are the -stream mode's flags.
type streamOpts struct {
	rates     []float64 // MB/s; 0 is full speed
	seconds   float64
	size      int
	snaplen   int
	bothSides bool
	ringMB    int
}

// runStream is -stream: a C source writing at a fixed rate into a C sink
// over a unix socket selected by path (both ends selected), with a kernel
// capture writing pcapng to nowhere; it reports the bytes sent and the
// bytes the capture recorded.
func runStream(o streamOpts) error {
	_, self, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(self), "csrc", "stream.c")
	if _, err := os.Stat(src); err != nil {
		return fmt.Errorf("-stream builds %s (run from the repository): %w", src, err)
	}
	dir, err := os.MkdirTemp("", "kcapture-stream")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "stream")
	if out, err := exec.Command("cc", "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		return fmt.Errorf("cc %s: %v\n%s", src, err, out)
	}
	fmt.Printf("C source -> C sink, %d-byte writes, %.0f s per rate, snaplen %d, ring %d MiB, both sides %v\n",
		o.size, o.seconds, o.snaplen, o.ringMB, o.bothSides)
	fmt.Println("| rate asked | sent | recorded | not recorded | kernel drop rate | recorded MB/s |")
	fmt.Println("|---|---|---|---|---|---|")
	for i, rate := range o.rates {
		if err := streamOnce(bin, filepath.Join(dir, fmt.Sprintf("s%d.sock", i)), rate, o); err != nil {
			return err
		}
	}
	return nil
}

func streamOnce(bin, path string, rate float64, o streamOpts) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(o.seconds*float64(time.Second))+60*time.Second)
	defer cancel()
	sink := exec.CommandContext(ctx, bin, "sink", path)
	sinkOut, _ := sink.StdoutPipe()
	sink.Stderr = os.Stderr
	if err := sink.Start(); err != nil {
		return err
	}
	defer sink.Process.Kill()
	sc := bufio.NewScanner(sinkOut)
	if !sc.Scan() || sc.Text() != "ready" {
		return fmt.Errorf("sink did not start")
	}
	c, err := kcapture.Open(kcapture.Options{Select: kcapture.Selection{Path: path}, Snaplen: o.snaplen,
		RingBytes: o.ringMB << 20, BothSides: o.bothSides, Attach: attachMode})
	if err != nil {
		return err
	}
	w, _ := pcapng.NewWriter(io.Discard, pcapng.Options{Snaplen: pcapng.MaxSegment})
	cctx, stopCapture := context.WithCancel(context.Background())
	type res struct {
		st  *kcapture.Stats
		err error
	}
	done := make(chan res, 1)
	go func() {
		st, err := c.Run(cctx, record.NewPcapSink(w, record.PcapOptions{}), nil)
		done <- res{st, err}
	}()
	time.Sleep(200 * time.Millisecond) // attached
	out, err := exec.CommandContext(ctx, bin, "source", path, strconv.FormatFloat(rate*1e6, 'f', 0, 64),
		strconv.FormatFloat(o.seconds, 'f', 3, 64), strconv.Itoa(o.size)).Output()
	if err != nil {
		stopCapture()
		<-done
		c.Close()
		return fmt.Errorf("source: %v", err)
	}
	var sent int64
	var elapsed float64
	fmt.Sscan(strings.TrimSpace(string(out)), &sent, &elapsed)
	sc.Scan()                          // the sink's total, after EOF
	time.Sleep(300 * time.Millisecond) // the reader drains the ring
	stopCapture()
	r := <-done
	c.Close()
	if r.err != nil {
		return r.err
	}
	st := r.st
	asked := "full speed"
	if rate > 0 {
		asked = fmt.Sprintf("%.0f MB/s", rate)
	}
	rec := int64(st.Tracker.Bytes)
	fmt.Printf("| %s | %.0f MB (%.0f MB/s) | %.0f MB | %d bytes (%.2f%%) | %.2f%% (%d events) | %.0f |\n",
		asked, float64(sent)/1e6, float64(sent)/1e6/elapsed, float64(rec)/1e6, sent-rec, 100*float64(sent-rec)/float64(max(sent, 1)),
		st.LossPercent(), st.Lost(), float64(rec)/1e6/elapsed)
	return nil
}

func parseRates(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("-stream %q: want MB/s values separated by commas (0: full speed)", s)
		}
		out = append(out, v)
	}
	return out, nil
}
