package shm

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Supported reports whether this system has the shared-memory path.
const Supported = true

// RequiredSeals are the seals a receiver insists on before mapping.
const RequiredSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// Create makes a sealed, mapped region of size bytes (CheckSize) as
// protocol/spec.md 10.2 says: a memfd with no path, sized, sealed against
// shrinking and growing, mapped shared. It returns the region and the fd to
// offer; the caller closes the fd once it has sent it.
func Create(size uint64) (*Region, int, error) {
	if err := CheckSize(size); err != nil {
		return nil, -1, err
	}
	fd, err := unix.MemfdCreate("udskit-shm", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, -1, fmt.Errorf("udskit shm: memfd_create: %w", err)
	}
	fail := func(what string, err error) (*Region, int, error) {
		unix.Close(fd)
		return nil, -1, fmt.Errorf("udskit shm: %s: %w", what, err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail("ftruncate", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, RequiredSeals); err != nil {
		return fail("seal", err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	return newRegion(mem, size), fd, nil
}

// OpenOffer checks the fd a client offered for a region of size bytes
// (already CheckSize'd) and maps it (protocol/spec.md 10.2): a regular file
// of exactly that size carrying the seals that keep it from shrinking, and
// no write seal. It does not close fd. Every failure is a *Error
// (NameBadOffer): the connection's protocol violation.
func OpenOffer(fd int, size uint64) (*Region, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, errf(NameBadOffer, "fstat of the offered descriptor: %v", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, errf(NameBadOffer, "the offered descriptor is not a memfd (mode %#o)", st.Mode)
	}
	if uint64(st.Size) != size {
		return nil, errf(NameBadOffer, "the offered memfd has %d bytes, the offer says %d", st.Size, size)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, errf(NameBadOffer, "the offered descriptor has no seals (not a sealable memfd): %v", err)
	}
	if seals&RequiredSeals != RequiredSeals {
		return nil, errf(NameBadOffer, "the offered memfd is not sealed against shrinking, growing and resealing (seals %#x, want %#x)", seals, RequiredSeals)
	}
	if seals&(unix.F_SEAL_WRITE|unix.F_SEAL_FUTURE_WRITE) != 0 {
		return nil, errf(NameBadOffer, "the offered memfd is sealed against writes (seals %#x)", seals)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, errf(NameBadOffer, "mmap of the offered memfd: %v", err)
	}
	return newRegion(mem, size), nil
}

func newRegion(mem []byte, size uint64) *Region {
	return &Region{mem: mem, size: size, unmap: func(b []byte) { _ = unix.Munmap(b) }}
}

// CloseFD closes a descriptor.
func CloseFD(fd int) { _ = unix.Close(fd) }
