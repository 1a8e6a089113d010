package kcapture

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// Selection modes (bpf/udscap.c MODE_*).
const (
	modeAll  = 0
	modePID  = 1
	modePath = 2
)

// Capture is an attached kernel capture. Open it, Run it once, Close it.
type Capture struct {
	opts  Options
	coll  *ebpf.Collection
	links []link.Link
	// attached names the programs of links, in attach order.
	attached []string
	rd       *ringReader
	method   string
	// monoOff converts CLOCK_MONOTONIC ns to Unix ns.
	monoOff int64
}

// Method says which attach point the capture uses (and why).
func (c *Capture) Method() string { return c.method }

// Open checks the machine, loads the BPF programs configured for opts.Select
// and attaches them. Events are buffered in the kernel from then on; Run
// reads them.
func Open(opts Options) (*Capture, error) {
	if err := opts.normalize(); err != nil {
		return nil, err
	}
	if err := checkPrivilege(); err != nil {
		return nil, err
	}
	if _, err := os.Stat(btfPath); err != nil {
		return nil, fmt.Errorf("%w (%s: %v): kernel capture needs CONFIG_DEBUG_INFO_BTF=y", ErrNoBTF, btfPath, err)
	}
	if err := ensureTracefs(true); err != nil {
		return nil, err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("kcapture: raising RLIMIT_MEMLOCK: %w", err)
	}
	spec, err := loadUdscap()
	if err != nil {
		return nil, fmt.Errorf("kcapture: embedded BPF object: %w", err)
	}
	c := &Capture{opts: opts}
	fentry := probeFentry(spec)
	if err := configure(spec, &opts); err != nil {
		return nil, err
	}
	how, err := c.loadAndAttach(spec, opts.Attach)
	if err != nil {
		return nil, err
	}
	c.method = methodName(fentry, how)
	opts.Logf("kernel capture: %s", c.method)
	c.rd, err = newRingReader(c.coll.Maps[udscapMapEvents].FD(), opts.RingBytes)
	if err != nil {
		c.Close()
		return nil, err
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		c.Close()
		return nil, err
	}
	c.monoOff = time.Now().UnixNano() - ts.Nano()
	return c, nil
}

// configure sets the load-time constants of the BPF program.
func configure(spec *ebpf.CollectionSpec, opts *Options) error {
	mode, tgid := uint32(modeAll), uint32(0)
	var vino uint64
	var vdev uint32
	switch s := opts.Select; {
	case s.PID != 0:
		mode, tgid = modePID, uint32(s.PID)
		if err := unix.Kill(s.PID, 0); errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("kcapture: no process %d (pids are as the host sees them: ps -e, or udskit ls)", s.PID)
		}
	case s.Path != "":
		var st unix.Stat_t
		if err := unix.Stat(s.Path, &st); err != nil {
			return fmt.Errorf("kcapture: %s: no socket at this path (%w); is the server running? udskit doctor %s", s.Path, err, s.Path)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			return fmt.Errorf("kcapture: %s is not a unix socket", s.Path)
		}
		mode, vino = modePath, st.Ino
		// The kernel's s_dev encoding: major<<20 | minor.
		vdev = unix.Major(st.Dev)<<20 | unix.Minor(st.Dev)
	}
	set := map[string]any{
		"cfg_mode":       mode,
		"cfg_tgid":       tgid,
		"cfg_vfs_ino":    vino,
		"cfg_vfs_dev":    vdev,
		"cfg_snaplen":    uint32(opts.Snaplen),
		"cfg_self":       uint32(os.Getpid()),
		"cfg_both_sides": boolU32(opts.BothSides),
		// Wake the reader when an eighth of the ring, at most 1 MiB, is
		// waiting (else it polls every 10 ms): early enough that a large
		// ring's slack is left for when it cannot run.
		"cfg_wake_bytes": uint64(min(opts.RingBytes/8, 1<<20)),
	}
	for name, v := range set {
		vs := spec.Variables[name]
		if vs == nil {
			return fmt.Errorf("kcapture: BPF object has no %s", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("kcapture: setting %s: %w", name, err)
		}
	}
	spec.Maps[udscapMapEvents].MaxEntries = uint32(opts.RingBytes)
	return nil
}

// Close detaches and unloads everything. Safe to call more than once.
func (c *Capture) Close() error {
	c.detach()
	if c.rd != nil {
		c.rd.close()
		c.rd = nil
	}
	if c.coll != nil {
		c.coll.Close()
		c.coll = nil
	}
	return nil
}

// detach closes the links in the reverse of their attach order (see
// attachSequence): the enter programs first.
func (c *Capture) detach() {
	for i := len(c.links) - 1; i >= 0; i-- {
		c.links[i].Close()
	}
	c.links = nil
}

// minInPlace is the smallest message written from the ring in place:
// copying a smaller one costs less than keeping its record.
const minInPlace = 4096

// reorderWindow is how long messages are held to put them in time order.
const reorderWindow = 20 * time.Millisecond

// Run reads events until ctx ends, writing connections to sink, then
// detaches, drains what the kernel still holds, and returns the counts.
// resolve names the processes and paths behind socket inodes; nil means
// NewResolver().
func (c *Capture) Run(ctx context.Context, sink Sink, resolve Resolver) (*Stats, error) {
	if c.rd == nil {
		return nil, errors.New("kcapture: capture is closed")
	}
	pr := &procResolver{}
	if resolve == nil {
		resolve = pr.resolve
	}
	st := &Stats{}
	tr := &Tracker{Sink: sink, Resolve: resolve, BoundPath: pr.boundPath, Clock: c.wall, Comm: procComm}
	asm := &Assembler{Snaplen: uint32(c.opts.Snaplen)}
	ro := &reorder{emit: func(m *Message) {
		tr.Message(m)
		if m.hold != 0 {
			c.rd.release(m.hold - 1)
		}
		asm.Release(m)
	}}
	asm.Emit = func(m *Message) { tr.Seen(m); ro.push(m) }
	var bad uint64
	lastStats := time.Now()
	var reported uint64
	report := func() {
		if err := c.readStats(st); err != nil {
			c.opts.Logf("kernel capture: reading counters: %v", err)
			return
		}
		if lost := st.Lost(); lost > reported {
			n := lost - reported
			reported = lost
			tr.Dropped(time.Now(), n, fmt.Sprintf("kernel capture lost %d events (ring buffer full, unreadable buffers, or missed program runs)", n))
		}
	}
	// Hand space back to the kernel every eighth of the ring while a long
	// run of records is read, not only at its end, and look at the clock
	// and ctx as often.
	commitEvery := uint64(c.opts.RingBytes / 8)
	// Messages of one record are written from the ring in place (no copy)
	// while the records so held take at most a quarter of the ring: they
	// wait there for the reorder window, and the rest is the kernel's room.
	maxHeld := uint64(c.opts.RingBytes / 4)
	draining := false
	quiet := 0
	lastDrain := time.Now()
	for {
		if !draining && ctx.Err() != nil {
			// Stop new events, then read what is left.
			c.detach()
			draining = true
		}
		got := 0
		var read uint64
		for {
			rec, ok, err := c.rd.next()
			if err != nil {
				c.rd.commit()
				return st, err
			}
			if !ok {
				break
			}
			got++
			read += uint64(len(rec))
			ch, perr := ParseChunk(rec)
			switch {
			case perr != nil:
				bad++
			case len(ch.Data) >= minInPlace && Whole(&ch) && c.rd.heldBytes < maxHeld:
				asm.AddWhole(&ch, c.rd.hold()+1)
				st.InPlace++
			default:
				asm.Add(&ch) // copies the data out of the ring
			}
			if read >= commitEvery {
				break // commit, and release held messages in time
			}
		}
		c.rd.commit()
		if draining && got == 0 {
			quiet++
		}
		if quiet >= 2 {
			// Detached, and nothing came in a wait: what is left is read.
			asm.Flush()
			ro.flush()
			tr.Tail(time.Now(), c.streamCount)
			report()
			st.Tracker = tr.Stats
			if bad > 0 {
				return st, fmt.Errorf("kcapture: %d malformed ring-buffer records", bad)
			}
			return st, tr.Err()
		}
		if now := time.Now(); now.Sub(lastDrain) >= reorderWindow/2 || got == 0 {
			ro.drain(c.monoNow() - uint64(reorderWindow))
			lastDrain = now
			if now.Sub(lastStats) > 500*time.Millisecond {
				report()
				lastStats = now
			}
		}
		if got == 0 {
			// While records are held the kernel's wakeup (when the data
			// waiting crosses a threshold, held records included) may
			// not come: look again sooner.
			wait := reorderWindow / 2
			if c.rd.heldBytes > 0 {
				wait = 2 * time.Millisecond
			}
			if err := c.rd.wait(wait); err != nil {
				return st, err
			}
		}
	}
}

func (c *Capture) wall(mono uint64) time.Time { return time.Unix(0, int64(mono)+c.monoOff) }

func (c *Capture) monoNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// readStats sums the per-cpu counters and the programs' missed runs.
// streamCount is the kernel's byte count of the socket with inode ino
// (sent, or received when recv), as Chunk.StreamOff counts it.
func (c *Capture) streamCount(ino uint64, recv bool) (uint64, bool) {
	key := ino << 1
	if recv {
		key |= 1
	}
	var n uint64
	if err := c.coll.Maps[udscapMapStreams].Lookup(key, &n); err != nil {
		return 0, false
	}
	return n, true
}

func (c *Capture) readStats(st *Stats) error {
	m := c.coll.Maps[udscapMapStats]
	dst := []*uint64{&st.Chunks, &st.LostChunks, &st.LostBytes, &st.Faults, &st.FaultBytes, &st.PendingFull}
	for i, p := range dst {
		var per []uint64
		if err := m.Lookup(uint32(i), &per); err != nil {
			return err
		}
		var sum uint64
		for _, v := range per {
			sum += v
		}
		*p = sum
	}
	var missed uint64
	for _, p := range c.coll.Programs {
		if s, err := p.Stats(); err == nil {
			missed += s.RecursionMisses
		}
	}
	st.Missed = missed
	return nil
}

func boolU32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}
