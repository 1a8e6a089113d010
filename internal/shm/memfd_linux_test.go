package shm

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestCreateAndOpenOffer(t *testing.T) {
	r, fd, err := Create(MinRegion)
	if err != nil {
		t.Fatal(err)
	}
	defer CloseFD(fd)
	peer, err := OpenOffer(fd, MinRegion)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Acquire() || !peer.Acquire() {
		t.Fatal("acquire")
	}
	d := Desc{Off: 4096, Len: 5}
	copy(r.Bytes(d), "hello")
	if got := string(peer.Bytes(d)); got != "hello" {
		t.Fatalf("peer sees %q", got)
	}
	r.Release()
	peer.Release()
	r.Close()
	peer.Close()
	if r.Acquire() {
		t.Fatal("acquired a closed region")
	}
	// The offered fd is still sealed: it cannot shrink (the SIGBUS guard).
	if err := unix.Ftruncate(fd, 4096); err == nil {
		t.Fatal("a sealed region shrank")
	}
}

func memfd(t *testing.T, size int64, seals int) int {
	fd, err := unix.MemfdCreate("t", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

func TestOpenOfferRefuses(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "file")
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(MinRegion)
	defer f.Close()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	noSealing, err := unix.MemfdCreate("t", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(noSealing)
	unix.Ftruncate(noSealing, MinRegion)
	cases := []struct {
		name string
		fd   int
	}{
		{"unsealed memfd", memfd(t, MinRegion, 0)},
		{"shrinkable (no F_SEAL_SHRINK)", memfd(t, MinRegion, unix.F_SEAL_GROW|unix.F_SEAL_SEAL)},
		{"growable (no F_SEAL_GROW)", memfd(t, MinRegion, unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL)},
		{"reseal allowed (no F_SEAL_SEAL)", memfd(t, MinRegion, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)},
		{"write-sealed", memfd(t, MinRegion, RequiredSeals|unix.F_SEAL_WRITE)},
		{"size differs from the offer", memfd(t, 2*MinRegion, RequiredSeals)},
		{"memfd without sealing", noSealing},
		{"regular file", int(f.Fd())},
		{"pipe", p[0]},
	}
	for _, c := range cases {
		r, err := OpenOffer(c.fd, MinRegion)
		if errName(err) != NameBadOffer {
			if r != nil {
				r.Close()
			}
			t.Errorf("%s: %v, want bad_offer", c.name, err)
		}
	}
}

func TestRegionCloseWaitsForReferences(t *testing.T) {
	r, fd, err := Create(MinRegion)
	if err != nil {
		t.Fatal(err)
	}
	CloseFD(fd)
	unmapped := 0
	inner := r.unmap
	r.unmap = func(b []byte) { unmapped++; inner(b) }
	if !r.Acquire() {
		t.Fatal("acquire")
	}
	r.Close()
	r.Close()
	if unmapped != 0 {
		t.Fatal("unmapped under a reference")
	}
	r.Bytes(Desc{0, 10})[0] = 1 // still mapped
	r.Release()
	if unmapped != 1 {
		t.Fatalf("unmapped %d times, want 1", unmapped)
	}
}
