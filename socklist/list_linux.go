package socklist

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/udskit/udskit/internal/proc"
)

// List takes a snapshot of the unix sockets visible from this process's
// network namespace, with the processes that hold them.
func List(ctx context.Context, opts Options) (*Snapshot, error) {
	root := opts.ProcRoot
	if root == "" {
		root = proc.Root
	}
	snap := &Snapshot{}
	var socks []Socket
	haveDiag := false
	if !opts.NoDiag {
		var err error
		socks, err = diagDump(ctx)
		if err == nil {
			haveDiag = true
			snap.Source = "sock_diag"
		} else {
			snap.Notes = append(snap.Notes, fmt.Sprintf("sock_diag unavailable (%v): no peer, queue or backlog data", err))
		}
	}
	if !haveDiag {
		f, err := os.Open(filepath.Join(root, "net/unix"))
		if err != nil {
			return nil, fmt.Errorf("list unix sockets: %w", err)
		}
		var bad int
		socks, bad, err = ParseProcNetUnix(f)
		f.Close()
		if err != nil {
			return nil, err
		}
		if bad > 0 {
			snap.Notes = append(snap.Notes, fmt.Sprintf("%d lines of /proc/net/unix did not parse", bad))
		}
		snap.Source = "/proc/net/unix"
	}
	owners, unreadable, err := scanFDs(ctx, root)
	if err != nil {
		return nil, err
	}
	snap.Unreadable = unreadable
	if unreadable > 0 {
		snap.Notes = append(snap.Notes, fmt.Sprintf(
			"could not read the open files of %d processes (other users'; run as root to see them): their sockets show no owner", unreadable))
	}
	join(socks, owners, haveDiag)
	if haveDiag {
		resolveMoved(socks)
	}
	sortSockets(socks)
	snap.Sockets = socks
	return snap, nil
}

// diagDump asks the kernel for every AF_UNIX socket over NETLINK_SOCK_DIAG.
func diagDump(ctx context.Context) ([]Socket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	// A dump that stalls must not hang ls/doctor.
	tv := unix.Timeval{Sec: 2}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	if err := unix.Sendto(fd, diagRequest(1), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("netlink send: %w", err)
	}
	buf := make([]byte, 64<<10)
	var out []Socket
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return nil, fmt.Errorf("netlink recv: %w", err)
		}
		socks, err := ParseDiagMessages(buf[:n])
		out = append(out, socks...)
		if len(out) > MaxSockets {
			return nil, fmt.Errorf("sock_diag: more than %d sockets", MaxSockets)
		}
		if errors.Is(err, errDiagDone) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, errors.New("sock_diag: empty reply")
		}
	}
}

// scanFDs maps socket inodes to the processes holding them, from the
// "socket:[N]" links in /proc/PID/fd. It returns how many processes it could
// not read (other users' processes, unprivileged).
func scanFDs(ctx context.Context, root string) (map[uint64][]Proc, int, error) {
	pids, err := proc.PIDs(root)
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", root, err)
	}
	owners := map[uint64][]Proc{}
	unreadable := 0
	for _, pid := range pids {
		if err := ctx.Err(); err != nil {
			return nil, 0, err
		}
		inos, err := proc.SocketInodes(root, pid)
		if err != nil {
			if errors.Is(err, os.ErrPermission) {
				unreadable++
			}
			continue // exited meanwhile, or unreadable
		}
		if len(inos) == 0 {
			continue
		}
		comm, err := proc.CommAt(root, pid)
		if err != nil {
			comm = "?"
		}
		for _, ino := range inos {
			owners[ino] = append(owners[ino], Proc{PID: pid, Command: comm})
		}
	}
	return owners, unreadable, nil
}
