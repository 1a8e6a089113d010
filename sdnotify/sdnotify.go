package sdnotify

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MaxMessage caps one notification's size.
const MaxMessage = 4096

// Enabled reports whether $NOTIFY_SOCKET is set.
func Enabled() bool { return os.Getenv("NOTIFY_SOCKET") != "" }

// Notify sends state, newline-separated KEY=VALUE assignments, to systemd.
// It returns nil without $NOTIFY_SOCKET.
func Notify(state string) error { return send(state, nil) }

// Ready says the service is up and serving.
func Ready() error { return Notify("READY=1") }

// Stopping says the service has begun to shut down (draining).
func Stopping() error { return Notify("STOPPING=1") }

// Status sets the free-form status line systemctl status shows.
func Status(s string) error { return Notify("STATUS=" + oneLine(s)) }

// MainPID tells systemd that pid is now the service's main process (after a
// handoff to a new process). With it, READY=1 marks the new process ready.
func MainPID(pid int) error { return Notify("MAINPID=" + strconv.Itoa(pid) + "\nREADY=1") }

// FDStore parks fds in systemd's file descriptor store under name
// (FileDescriptorStoreMax= must be set in the unit). systemd passes them
// back with LISTEN_FDS / LISTEN_FDNAMES on the next start (see the uds
// systemd:NAME address).
func FDStore(name string, fds []int) error {
	if name == "" || strings.ContainsAny(name, ":\n") || len(name) > 255 {
		return fmt.Errorf("sdnotify: fd store name %q: 1 to 255 characters, no ':' or newline", name)
	}
	if len(fds) == 0 {
		return errors.New("sdnotify: FDStore with no descriptors")
	}
	return send("FDSTORE=1\nFDNAME="+name, fds)
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

func send(state string, fds []int) error {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return nil
	}
	if len(state) > MaxMessage {
		return fmt.Errorf("sdnotify: message of %d bytes, at most %d", len(state), MaxMessage)
	}
	if addr[0] != '/' && addr[0] != '@' {
		return fmt.Errorf("sdnotify: NOTIFY_SOCKET=%q is neither a path nor an @abstract name", addr)
	}
	fd, err := dgramSocket()
	if err != nil {
		return fmt.Errorf("sdnotify: %w", os.NewSyscallError("socket", err))
	}
	defer unix.Close(fd)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	// A leading '@' is the abstract namespace (x/sys maps it to a NUL).
	if err := unix.Sendmsg(fd, []byte(state), oob, &unix.SockaddrUnix{Name: addr}, 0); err != nil {
		return fmt.Errorf("sdnotify: send to %s: %w", addr, os.NewSyscallError("sendmsg", err))
	}
	return nil
}
