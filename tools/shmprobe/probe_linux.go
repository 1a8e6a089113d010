package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/udskit/udskit/internal/proc"
	"github.com/udskit/udskit/internal/shm"
)

// The child's settings travel in its environment.
const (
	envN        = "SHMPROBE_N"
	envSize     = "SHMPROBE_SIZE"
	envSpin     = "SHMPROBE_SPIN_NS" // negative: never sleep
	envConns    = "SHMPROBE_CONNS"
	envLifetime = "SHMPROBE_LIFETIME_NS"
	envCorrupt  = "SHMPROBE_CORRUPT"  // tests: the server flips a byte of every answer
	envReady    = "SHMPROBE_READY_FD" // the child writes a byte there once it serves
)

const (
	futexWaitOp = 0 // FUTEX_WAIT, not _PRIVATE: the word is in a shared mapping
	futexWakeOp = 1
	sleepCap    = 10 * time.Millisecond // a sleeper looks at its stop word at least this often
	answerWait  = 2 * time.Second       // a caller's longest wait for one answer
	maxLatency  = 1 << 16               // latencies kept per caller and cell
)

// futexWait sleeps while *p == val, at most d (or until a wake).
func futexWait(p *atomic.Uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(p)), futexWaitOp, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes one sleeper on p.
func futexWake(p *atomic.Uint32) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(p)), futexWakeOp, 1, 0, 0, 0)
}

// ring is a view of the mapped region (layout.go).
type ring struct {
	mem  []byte
	n    int
	slot int
}

func newRing(mem []byte, n, size int) (*ring, error) {
	if len(mem) < regionSize(n, size) {
		return nil, fmt.Errorf("region of %d bytes, %d callers of %d need %d", len(mem), n, size, regionSize(n, size))
	}
	return &ring{mem: mem, n: n, slot: slotSize(size)}, nil
}

func (r *ring) word(off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&r.mem[off]))
}
func (r *ring) line(i int) int              { return offCallers + i*callerLine }
func (r *ring) reqSeq(i int) *atomic.Uint32 { return r.word(r.line(i)) }
func (r *ring) reqLen(i int) *atomic.Uint32 { return r.word(r.line(i) + 4) }
func (r *ring) ansSeq(i int) *atomic.Uint32 { return r.word(r.line(i) + 64) }
func (r *ring) ansLen(i int) *atomic.Uint32 { return r.word(r.line(i) + 68) }

// callerSleep (futexd) is 1 while caller i is about to sleep or sleeps on
// its answer word.
func (r *ring) callerSleep(i int) *atomic.Uint32 { return r.word(r.line(i) + 8) }
func (r *ring) reqSlot(i int) []byte {
	o := hdrSize + i*r.slot
	return r.mem[o : o+r.slot : o+r.slot]
}
func (r *ring) ansSlot(i int) []byte {
	o := hdrSize + (r.n+i)*r.slot
	return r.mem[o : o+r.slot : o+r.slot]
}

// echo copies caller i's request slot into its answer slot, the length
// bounds-checked once (a length past the slot answers nothing).
func (r *ring) echo(i int, l uint32, corrupt bool) uint32 {
	if l > uint32(r.slot) {
		return 0
	}
	copy(r.ansSlot(i)[:l], r.reqSlot(i)[:l])
	if corrupt && l > 0 {
		r.ansSlot(i)[l/2] ^= 0xff
	}
	return l
}

// ---- the child (server) ----

func childMain() int {
	base := os.Getenv(childEnv)
	n, _ := strconv.Atoi(os.Getenv(envN))
	size, _ := strconv.Atoi(os.Getenv(envSize))
	spinNS, _ := strconv.ParseInt(os.Getenv(envSpin), 10, 64)
	conns, _ := strconv.Atoi(os.Getenv(envConns))
	life, _ := strconv.ParseInt(os.Getenv(envLifetime), 10, 64)
	corrupt := os.Getenv(envCorrupt) == "1"
	if n < 1 || n > maxCallers || size < 16 || life <= 0 {
		fmt.Fprintln(os.Stderr, "shmprobe child: bad settings")
		return 2
	}
	time.AfterFunc(time.Duration(life), func() {
		fmt.Fprintln(os.Stderr, "shmprobe child: lifetime over, exiting")
		os.Exit(3)
	})
	ready := func() {
		if fd, err := strconv.Atoi(os.Getenv(envReady)); err == nil && fd > 2 {
			f := os.NewFile(uintptr(fd), "ready")
			_, _ = f.Write([]byte{1})
			f.Close()
		}
	}
	var r *ring
	if base != "raw" {
		reg, err := shm.OpenOffer(3, uint64(regionSize(n, size)))
		if err != nil {
			fmt.Fprintln(os.Stderr, "shmprobe child:", err)
			return 2
		}
		if !reg.Acquire() {
			return 2
		}
		if r, err = newRing(reg.Bytes(shm.Desc{Off: 0, Len: uint32(regionSize(n, size))}), n, size); err != nil {
			fmt.Fprintln(os.Stderr, "shmprobe child:", err)
			return 2
		}
	}
	switch base {
	case "raw":
		serveConns(3, n, ready, func(c net.Conn) { serveRaw(c, size, corrupt) })
	case "sock":
		serveConns(4, conns, ready, func(c net.Conn) { serveFrames(c, r, corrupt) })
	case "futex", "spin", "futexd":
		ready()
		serveRing(r, time.Duration(spinNS), base == "futexd", corrupt)
	default:
		fmt.Fprintln(os.Stderr, "shmprobe child: unknown variant", base)
		return 2
	}
	return 0
}

// serveConns serves k inherited sockets from fd first on, until each ends;
// ready is called once all are served.
func serveConns(first, k int, ready func(), serve func(net.Conn)) {
	var wg sync.WaitGroup
	for j := 0; j < k; j++ {
		f := os.NewFile(uintptr(first+j), "sock")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			fmt.Fprintln(os.Stderr, "shmprobe child:", err)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			serve(c)
		}()
	}
	ready()
	wg.Wait()
}

// serveRaw is the floor: read exactly size bytes, write them back.
func serveRaw(c net.Conn, size int, corrupt bool) {
	buf := make([]byte, size)
	for {
		if _, err := io.ReadFull(c, buf); err != nil {
			return
		}
		if corrupt {
			buf[size/2] ^= 0xff
		}
		if _, err := c.Write(buf); err != nil {
			return
		}
	}
}

// serveFrames reads batches of 16-byte request frames (caller, sequence,
// length), echoes each slot in the region and writes the batch's answer
// frames with one write. A caller index or length out of bounds ends the
// connection (a hostile peer costs only its own connection).
func serveFrames(c net.Conn, r *ring, corrupt bool) {
	out := make([]byte, 0, 64<<10)
	readFrames(c, func(i, seq, l uint32) bool {
		if i >= uint32(r.n) || l > uint32(r.slot) {
			fmt.Fprintf(os.Stderr, "shmprobe child: frame out of bounds (caller %d, length %d)\n", i, l)
			return false
		}
		l = r.echo(int(i), l, corrupt)
		out = binary.LittleEndian.AppendUint32(out, i)
		out = binary.LittleEndian.AppendUint32(out, seq)
		out = binary.LittleEndian.AppendUint32(out, l)
		out = binary.LittleEndian.AppendUint32(out, 0)
		return true
	}, func() bool {
		if len(out) > 0 {
			if _, err := c.Write(out); err != nil {
				return false
			}
			out = out[:0]
		}
		return true
	})
}

// readFrames reads batches of 16-byte frames (caller, sequence, length) from
// c and calls frame for each, then batch once per read; it returns when a
// read fails or either callback returns false.
func readFrames(c net.Conn, frame func(i, seq, l uint32) bool, batch func() bool) {
	in := make([]byte, 64<<10)
	have := 0
	for {
		k, err := c.Read(in[have:])
		if err != nil {
			return
		}
		have += k
		off := 0
		for ; off+frameSize <= have; off += frameSize {
			f := in[off : off+frameSize]
			if !frame(binary.LittleEndian.Uint32(f), binary.LittleEndian.Uint32(f[4:]), binary.LittleEndian.Uint32(f[8:])) {
				return
			}
		}
		have = copy(in, in[off:have])
		if !batch() {
			return
		}
	}
}

// serveRing is the futex (spin >= 0) and spin (spin < 0) server: one
// thread scans the callers' request words; after a batch it bumps the
// client's bell and wakes it only when it says it sleeps. Idle for spin, it
// says it sleeps, looks once more, and waits on its own bell. direct
// (futexd): each answer wakes its own caller, on its answer word, when that
// caller says it sleeps; no client bell.
func serveRing(r *ring, spin time.Duration, direct, corrupt bool) {
	runtime.LockOSThread()
	last := make([]uint32, r.n)
	stop, srvBell, srvSleep := r.word(offStop), r.word(offSrvBell), r.word(offSrvSleep)
	cliBell, cliSleep := r.word(offCliBell), r.word(offCliSleep)
	pending := func() bool {
		for i := range last {
			if r.reqSeq(i).Load() != last[i] {
				return true
			}
		}
		return false
	}
	idle := 0
	var idleStart time.Time
	for {
		did := false
		for i := range last {
			s := r.reqSeq(i).Load()
			if s == last[i] {
				continue
			}
			l := r.echo(i, r.reqLen(i).Load(), corrupt)
			r.ansLen(i).Store(l)
			r.ansSeq(i).Store(s)
			last[i] = s
			did = true
			if direct && r.callerSleep(i).Load() != 0 {
				futexWake(r.ansSeq(i))
			}
		}
		if did && direct {
			idle = 0
			continue
		}
		if did {
			cliBell.Add(1)
			if cliSleep.Load() != 0 {
				futexWake(cliBell)
			}
			idle = 0
			continue
		}
		if idle == 0 {
			idleStart = time.Now()
		}
		idle++
		if idle&63 != 0 {
			continue
		}
		if stop.Load() != 0 {
			return
		}
		if spin < 0 || time.Since(idleStart) < spin {
			continue
		}
		b := srvBell.Load()
		srvSleep.Store(1)
		if !pending() && stop.Load() == 0 {
			futexWait(srvBell, b, sleepCap)
		}
		srvSleep.Store(0)
		idle = 0
	}
}

// ---- the parent (client) ----

// caller does one echo of src (stamped with seq) for caller i and returns
// the answer's bytes, valid until caller i's next call.
type caller func(i int, src []byte, seq uint32) ([]byte, error)

func runCell(cfg config, v variant) (res result, err error) {
	if v.cprocs > 0 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(v.cprocs))
	}
	exe, err := os.Executable()
	if err != nil {
		return res, err
	}
	size := regionSize(cfg.n, cfg.size)
	var extra []*os.File
	var parentSocks []net.Conn
	defer func() {
		for _, c := range parentSocks {
			c.Close()
		}
	}()
	var r *ring
	if v.base != "raw" {
		reg, fd, err := shm.Create(uint64(size))
		if err != nil {
			return res, err
		}
		defer reg.Close()
		if !reg.Acquire() {
			return res, errors.New("region closed")
		}
		defer reg.Release()
		extra = append(extra, os.NewFile(uintptr(fd), "memfd"))
		if r, err = newRing(reg.Bytes(shm.Desc{Off: 0, Len: uint32(size)}), cfg.n, cfg.size); err != nil {
			return res, err
		}
	}
	socks := 0
	switch v.base {
	case "raw":
		socks = cfg.n
	case "sock":
		socks = cfg.sockConns
	}
	for j := 0; j < socks; j++ {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return res, fmt.Errorf("socketpair: %w", err)
		}
		pf := os.NewFile(uintptr(fds[0]), "sock")
		c, err := net.FileConn(pf)
		pf.Close()
		if err != nil {
			unix.Close(fds[1])
			return res, err
		}
		parentSocks = append(parentSocks, c)
		extra = append(extra, os.NewFile(uintptr(fds[1]), "sock"))
	}
	rp, wp, err := os.Pipe()
	if err != nil {
		return res, err
	}
	defer rp.Close()
	extra = append(extra, wp)
	spin := cfg.spin
	if v.spin >= 0 {
		spin = v.spin
	}
	if v.base == "spin" {
		spin = -1
	}
	cmd := exec.Command(exe)
	cmd.Args = append(cmd.Args, os.Args[1:]...)
	cmd.Env = append(os.Environ(),
		childEnv+"="+v.base,
		envN+"="+strconv.Itoa(cfg.n),
		envSize+"="+strconv.Itoa(cfg.size),
		envSpin+"="+strconv.FormatInt(int64(spin), 10),
		envConns+"="+strconv.Itoa(socks),
		envLifetime+"="+strconv.FormatInt(int64(cfg.warmup+cfg.duration+30*time.Second), 10),
		envReady+"="+strconv.Itoa(2+len(extra)), // ExtraFiles[i] is fd 3+i; the pipe is the last
	)
	if corruptForTest {
		cmd.Env = append(cmd.Env, envCorrupt+"=1")
	}
	// A -race build sleeps 1 s at exit by default; a cell's child need not.
	cmd.Env = append(cmd.Env, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	if v.sprocs > 0 {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(v.sprocs))
	}
	cmd.ExtraFiles = extra
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	for _, f := range extra {
		f.Close() // the child has its copies; the region stays mapped here
	}
	if err != nil {
		return res, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	defer func() {
		// End the child: closed sockets (raw, sock) or the stop word.
		for _, c := range parentSocks {
			c.Close()
		}
		if r != nil {
			r.word(offStop).Store(1)
			r.word(offSrvBell).Add(1)
			futexWake(r.word(offSrvBell))
		}
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			if err == nil {
				err = errors.New("the server did not stop within 5 s; killed")
			}
		}
	}()

	// Wait until the child serves (exec and start-up under load can take
	// longer than a warm-up), at most 10 s.
	_ = rp.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := rp.Read(make([]byte, 1)); err != nil {
		return res, fmt.Errorf("the server did not say it serves: %w", err)
	}
	var call caller
	var stopClient func()
	switch v.base {
	case "raw":
		call = rawCaller(parentSocks, cfg.size)
	case "sock":
		call, stopClient = sockCaller(r, parentSocks, exited)
	case "futex":
		g := 4
		if v.gosched >= 0 {
			g = v.gosched
		}
		call, stopClient = futexCaller(r, spin, g, exited)
	case "spin":
		call = spinCaller(r, exited)
	case "futexd":
		g := 4
		if v.gosched >= 0 {
			g = v.gosched
		}
		call = futexDirectCaller(r, g, exited)
	}
	res, err = drive(cfg, call, cmd.Process.Pid)
	if stopClient != nil {
		stopClient()
	}
	return res, err
}

// corruptForTest makes the child flip a byte of every answer (tests only).
var corruptForTest bool

// drive runs cfg.n callers for warm-up plus duration and measures the
// duration: calls, both processes' CPU, p50.
func drive(cfg config, call caller, child int) (result, error) {
	const (
		warm = iota
		measure
		stop
	)
	var phase atomic.Int32
	counts := make([]int64, cfg.n)
	lats := make([][]time.Duration, cfg.n)
	errs := make([]error, cfg.n)
	var wg sync.WaitGroup
	for i := 0; i < cfg.n; i++ {
		lats[i] = make([]time.Duration, 0, maxLatency)
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := make([]byte, cfg.size)
			rng := rand.New(rand.NewPCG(uint64(i)+1, 42))
			for k := range src {
				src[k] = byte(rng.Uint32())
			}
			want := src
			for seq := uint32(1); phase.Load() != stop; seq++ {
				binary.LittleEndian.PutUint32(src, seq)
				binary.LittleEndian.PutUint32(src[len(src)-4:], seq)
				t0 := time.Now()
				got, err := call(i, src, seq)
				d := time.Since(t0)
				if err != nil {
					errs[i] = fmt.Errorf("caller %d, call %d: %w", i, seq, err)
					phase.Store(stop)
					return
				}
				ok := len(got) == len(want)
				if ok && cfg.full {
					ok = bytes.Equal(got, want)
				} else if ok {
					ok = bytes.Equal(got[:4], want[:4]) && bytes.Equal(got[len(got)-4:], want[len(want)-4:])
				}
				if !ok {
					errs[i] = fmt.Errorf("caller %d, call %d: %w (%d bytes back for %d)", i, seq, errMismatch, len(got), len(want))
					phase.Store(stop)
					return
				}
				if phase.Load() == measure {
					counts[i]++
					if len(lats[i]) < maxLatency {
						lats[i] = append(lats[i], d)
					}
				}
			}
		}()
	}
	cpu := func() (time.Duration, time.Duration) {
		a, _ := proc.ReadStat(os.Getpid())
		b, _ := proc.ReadStat(child)
		return a.CPU(), b.CPU()
	}
	time.Sleep(cfg.warmup)
	c0, s0 := cpu()
	t0 := time.Now()
	if !phase.CompareAndSwap(warm, measure) {
		wg.Wait()
		return result{}, errors.Join(errs...)
	}
	deadline := t0.Add(cfg.duration)
	for phase.Load() == measure && time.Now().Before(deadline) {
		time.Sleep(min(10*time.Millisecond, time.Until(deadline)))
	}
	elapsed := time.Since(t0)
	c1, s1 := cpu()
	phase.Store(stop)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return result{}, err
	}
	res := result{elapsed: elapsed, cliCPU: c1 - c0, srvCPU: s1 - s0}
	var all []time.Duration
	for i := range counts {
		res.calls += counts[i]
		all = append(all, lats[i]...)
	}
	if res.calls == 0 {
		return res, fmt.Errorf("no call completed in the %v measured", elapsed)
	}
	if len(all) > 0 {
		slices.Sort(all)
		res.p50 = all[len(all)/2]
	}
	return res, nil
}

func rawCaller(conns []net.Conn, size int) caller {
	bufs := make([][]byte, len(conns))
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	return func(i int, src []byte, _ uint32) ([]byte, error) {
		c := conns[i]
		if _, err := c.Write(src); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(c, bufs[i]); err != nil {
			return nil, err
		}
		return bufs[i], nil
	}
}

// sockCaller: the request in caller i's slot, a 16-byte frame on socket
// i mod K; one reader per socket hands answers to callers by channel.
func sockCaller(r *ring, conns []net.Conn, exited <-chan struct{}) (caller, func()) {
	ch := make([]chan [2]uint32, r.n)
	frames := make([][frameSize]byte, r.n)
	timers := newTimers(r.n)
	for i := range ch {
		ch[i] = make(chan [2]uint32, 1)
	}
	for _, c := range conns {
		go readFrames(c, func(i, seq, l uint32) bool {
			if i >= uint32(r.n) {
				fmt.Fprintln(os.Stderr, "shmprobe: answer frame for caller", i)
				c.Close()
				return false
			}
			ch[i] <- [2]uint32{seq, l}
			return true
		}, func() bool { return true })
	}
	call := func(i int, src []byte, seq uint32) ([]byte, error) {
		copy(r.reqSlot(i), src)
		f := frames[i][:]
		binary.LittleEndian.PutUint32(f, uint32(i))
		binary.LittleEndian.PutUint32(f[4:], seq)
		binary.LittleEndian.PutUint32(f[8:], uint32(len(src)))
		if _, err := conns[i%len(conns)].Write(f); err != nil {
			return nil, err
		}
		t := timers.start(i)
		defer t.Stop()
		select {
		case a := <-ch[i]:
			if a[0] != seq || a[1] > uint32(r.slot) {
				return nil, fmt.Errorf("answer frame for call %d (length %d), want call %d", a[0], a[1], seq)
			}
			return r.ansSlot(i)[:a[1]], nil
		case <-exited:
			return nil, errServerExited
		case <-t.C:
			return nil, errNoAnswer
		}
	}
	return call, func() {}
}

// timers are one reusable timer per caller (no allocation per wait).
type timers []*time.Timer

func newTimers(n int) timers {
	ts := make(timers, n)
	for i := range ts {
		ts[i] = time.NewTimer(time.Hour)
		ts[i].Stop()
	}
	return ts
}

// start arms caller i's timer for answerWait.
func (ts timers) start(i int) *time.Timer {
	ts[i].Reset(answerWait)
	return ts[i]
}

// answer reads caller i's answer if it is the one for seq.
func (r *ring) answer(i int, seq uint32) ([]byte, bool, error) {
	if r.ansSeq(i).Load() != seq {
		return nil, false, nil
	}
	l := r.ansLen(i).Load()
	if l > uint32(r.slot) {
		return nil, true, fmt.Errorf("answer length %d past the slot", l)
	}
	return r.ansSlot(i)[:l], true, nil
}

// post publishes caller i's request and rings the server's bell, waking
// it only when it says it sleeps.
func (r *ring) post(i int, src []byte, seq uint32) {
	copy(r.reqSlot(i), src)
	r.reqLen(i).Store(uint32(len(src)))
	r.reqSeq(i).Store(seq)
	bell := r.word(offSrvBell)
	bell.Add(1)
	if r.word(offSrvSleep).Load() != 0 {
		futexWake(bell)
	}
}

// spinCaller: callers spin (runtime.Gosched) on their own answer word.
func spinCaller(r *ring, exited <-chan struct{}) caller {
	return func(i int, src []byte, seq uint32) ([]byte, error) {
		r.post(i, src, seq)
		start := time.Now()
		for k := 1; ; k++ {
			if b, ok, err := r.answer(i, seq); ok {
				return b, err
			}
			runtime.Gosched()
			if k&1023 == 0 {
				if err := gaveUp(exited, start); err != nil {
					return nil, err
				}
			}
		}
	}
}

// futexCaller: a caller spins a little (a few Gosched), then parks on its
// channel; one poller goroutine hands it its answer. The poller spins for
// spin, then says it sleeps and waits on the client's bell, which the
// server wakes only then.
func futexCaller(r *ring, spin time.Duration, callerSpins int, exited <-chan struct{}) (caller, func()) {
	type slotState struct {
		waiting atomic.Uint32
		expect  atomic.Uint32
		_       [56]byte
	}
	st := make([]slotState, r.n)
	timers := newTimers(r.n)
	ch := make([]chan struct{}, r.n)
	for i := range ch {
		ch[i] = make(chan struct{}, 1)
	}
	var quit atomic.Bool
	done := make(chan struct{})
	bell, sleep := r.word(offCliBell), r.word(offCliSleep)
	ready := func() bool {
		for i := range st {
			if st[i].waiting.Load() == 1 && r.ansSeq(i).Load() == st[i].expect.Load() {
				return true
			}
		}
		return false
	}
	go func() {
		defer close(done)
		idle := 0
		var idleStart time.Time
		for !quit.Load() {
			found := false
			for i := range st {
				if st[i].waiting.Load() == 1 && r.ansSeq(i).Load() == st[i].expect.Load() && st[i].waiting.CompareAndSwap(1, 0) {
					ch[i] <- struct{}{}
					found = true
				}
			}
			if found {
				idle = 0
				continue
			}
			if idle == 0 {
				idleStart = time.Now()
			}
			idle++
			if idle&15 != 0 || time.Since(idleStart) < spin {
				runtime.Gosched()
				continue
			}
			b := bell.Load()
			sleep.Store(1)
			if !ready() {
				futexWait(bell, b, sleepCap)
			}
			sleep.Store(0)
			idle = 0
		}
	}()
	call := func(i int, src []byte, seq uint32) ([]byte, error) {
		r.post(i, src, seq)
		for k := 0; k < callerSpins; k++ {
			if b, ok, err := r.answer(i, seq); ok {
				return b, err
			}
			runtime.Gosched()
		}
		s := &st[i]
		s.expect.Store(seq)
		s.waiting.Store(1)
		if r.ansSeq(i).Load() == seq && s.waiting.CompareAndSwap(1, 0) {
			b, _, err := r.answer(i, seq)
			return b, err
		}
		t := timers.start(i)
		defer t.Stop()
		select {
		case <-ch[i]:
			b, _, err := r.answer(i, seq)
			return b, err
		case <-exited:
			return nil, errServerExited
		case <-t.C:
			return nil, errNoAnswer
		}
	}
	return call, func() { quit.Store(true); <-done }
}

// futexDirectCaller (futexd): a caller looks a few times (runtime.Gosched),
// then says it sleeps and waits with FUTEX_WAIT on its own answer word: no
// poller, but a thread per sleeping caller.
func futexDirectCaller(r *ring, callerSpins int, exited <-chan struct{}) caller {
	return func(i int, src []byte, seq uint32) ([]byte, error) {
		r.post(i, src, seq)
		for k := 0; k < callerSpins; k++ {
			if b, ok, err := r.answer(i, seq); ok {
				return b, err
			}
			runtime.Gosched()
		}
		start := time.Now()
		ans, sleep := r.ansSeq(i), r.callerSleep(i)
		for {
			sleep.Store(1)
			if a := ans.Load(); a != seq {
				futexWait(ans, a, sleepCap)
			}
			sleep.Store(0)
			if b, ok, err := r.answer(i, seq); ok {
				return b, err
			}
			if err := gaveUp(exited, start); err != nil {
				return nil, err
			}
		}
	}
}

var (
	errServerExited = errors.New("the server exited")
	errNoAnswer     = fmt.Errorf("no answer within %v", answerWait)
)

// gaveUp is a polling caller's look at why it should stop waiting: the
// server exited, or answerWait has passed since start.
func gaveUp(exited <-chan struct{}, start time.Time) error {
	select {
	case <-exited:
		return errServerExited
	default:
	}
	if time.Since(start) > answerWait {
		return errNoAnswer
	}
	return nil
}
