"""Listening sockets with the hygiene of Go's uds.Listen (docs/listen.md).

For a socket path:
1. The path length is checked first (107 usable bytes on Linux).
2. Missing parent directories are created with dir_mode, applied exactly.
3. An exclusive flock on PATH.lock is held across probe, unlink and bind, so
   two servers racing for one path cannot both win. PATH.lock must be a
   regular file of ours: it is opened with O_NOFOLLOW|O_NONBLOCK, and a
   symlink, a FIFO, any other non-regular file or another user's file there
   is refused (ListenError "bad_lock"), as in Go's uds.Listen. A listen that
   fails removes the lock it took (unless a socket is at the path).
4. Something at the path: not a socket -> never removed (ListenError
   "not_socket"); a socket that accepts a probe connect (or whose backlog is
   full) -> ListenError "in_use" with the server's pid from SO_PEERCRED; a
   socket that refuses (ECONNREFUSED) is stale and removed, only if the path
   still holds the very file (device, inode) that was probed.
5. No world-accessible window: the mode is set on the socket with fchmod
   *before* bind. Linux creates the socket file with the socket inode's mode
   (less the umask), so the file never exists with looser bits; a chmod after
   bind then sets the exact mode, and listen() comes only after that, so every
   connect before it is refused anyway. The umask is never changed.
6. Close: the listener closes first; then, under the lock, the file is removed
   only if the path still holds the file this listener bound (same device,
   inode and ctime), and PATH.lock with it when the path is then free. A
   socket another server has since bound, and a lock file that is not ours,
   are left alone.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import stat
import struct
import time
from dataclasses import dataclass, field

from ._addr import Address, join_host_port
from ._errors import ListenError

log = logging.getLogger("udskit")

MAX_PATH = 107
PROBE_TIMEOUT = 0.2
_CRED = struct.Struct("3i")


def peer_cred(sock: socket.socket) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of a unix socket's peer as the kernel reports them (SO_PEERCRED)."""
    if sock.family != socket.AF_UNIX or not hasattr(socket, "SO_PEERCRED"):
        return None
    b = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    pid, uid, gid = _CRED.unpack(b)
    return pid, uid, gid


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISREG, "regular file"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISLNK, "symlink"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "non-socket file"


def _mkdirs(parent: str, dir_mode: int) -> None:
    missing = []
    p = parent
    while p and not os.path.lexists(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        try:
            os.mkdir(d, dir_mode)
        except FileExistsError:
            continue
        os.chmod(d, dir_mode)


def _probe(path: str | bytes, timeout: float) -> tuple[bool, int | None]:
    """Connects to path: (live, pid). live is False only for ECONNREFUSED/ENOENT."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False, None
    except (BlockingIOError, socket.timeout):
        return True, None  # backlog full or slow: someone is there
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.ETIMEDOUT):
            return True, None
        raise
    else:
        cred = peer_cred(s)
        return True, cred[0] if cred else None
    finally:
        s.close()


def _clear_stale(path: str, probe_timeout: float) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ListenError("not_socket", f"{path} exists and is a {_kind(st.st_mode)}, not a socket; not removing it")
    live, pid = _probe(path, probe_timeout)
    if live:
        who = f" (pid {pid})" if pid else ""
        raise ListenError("in_use", f"{path} is in use by a live server{who}", pid)
    try:
        st2 = os.lstat(path)
    except FileNotFoundError:
        return
    if (st2.st_dev, st2.st_ino) == (st.st_dev, st.st_ino) and stat.S_ISSOCK(st2.st_mode):
        os.unlink(path)
        log.info("udskit: removed stale socket %s (nothing listened there)", path)


@dataclass
class Listener:
    """A listening socket and what is needed to clean up after it."""

    sock: socket.socket
    addr: Address
    _ident: tuple[int, int, int] | None = None
    _closed: bool = field(default=False)

    def close(self) -> None:
        """Closes the socket; removes the file only if the path still holds ours."""
        if self._closed:
            return
        self._closed = True
        try:
            self.sock.close()
        except OSError:
            pass
        if self.addr.kind != "unix" or self._ident is None:
            return
        path = self.addr.name
        try:
            lock = _lock(path, wait=1.0)
        except (OSError, ListenError):
            return  # not our lock to take (or busy): leave the files alone
        try:
            try:
                st = os.lstat(path)
                if (st.st_dev, st.st_ino, st.st_ctime_ns) == self._ident and stat.S_ISSOCK(st.st_mode):
                    os.unlink(path)
            except FileNotFoundError:
                pass  # (Python 3.13's asyncio removes its own socket file on close, checking the inode too)
            if not os.path.lexists(path):
                _unlink_lock(path, lock)  # the path is free; we hold the lock
        finally:
            os.close(lock)


def _bad_lock(name: str, what: str) -> ListenError:
    return ListenError(
        "bad_lock",
        f"lock file {name} is a {what}, not a regular file of ours: someone else put it there; remove it (after checking who) and retry",
    )


def _open_lock(name: str) -> int:
    """Opens (creating 0600) the lock file name, which must be a regular file
    owned by us: O_NOFOLLOW refuses a symlink there, O_NONBLOCK keeps a FIFO
    from hanging the open (it is then refused like any non-regular file)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError:
        try:
            st = os.lstat(name)
        except OSError:
            raise
        if not stat.S_ISREG(st.st_mode):
            raise _bad_lock(name, _kind(st.st_mode)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _bad_lock(name, _kind(st.st_mode))
        if st.st_uid != os.geteuid():
            raise _bad_lock(name, f"file owned by uid {st.st_uid} (we are uid {os.geteuid()})")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock(path: str, wait: float = 0.0) -> int:
    """Opens and exclusively flocks PATH.lock (polling up to wait seconds); the
    lock is always on the file now at that name (one removed meanwhile by a
    closing server is not kept)."""
    name = path + ".lock"
    end = time.monotonic() + wait
    delay = 0.001
    while True:
        fd = _open_lock(name)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= end:
                        raise ListenError("in_use", f"{path} is being taken by another server right now ({name} is locked)") from None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.05)
            held = os.fstat(fd)
            try:
                now = os.lstat(name)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the file was replaced while we waited: lock the new one


def _unlink_lock(path: str, lock: int) -> None:
    """Removes PATH.lock if it is still the file locked by lock."""
    name = path + ".lock"
    try:
        held = os.fstat(lock)
        now = os.lstat(name)
    except OSError:
        return
    if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass


def _unlink_lock_unless_socket(path: str, lock: int) -> None:
    """After a failed listen: our lock goes, unless a socket is at path (a live
    server's, whose close removes it)."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            return
    except OSError:
        pass
    _unlink_lock(path, lock)


def listen(
    addr: Address,
    *,
    mode: int = 0o600,
    dir_mode: int = 0o700,
    mkdir: bool = True,
    backlog: int = 512,
    probe_timeout: float = PROBE_TIMEOUT,
) -> Listener:
    if addr.kind in ("tls", "ssh"):
        raise ValueError(f"{addr}: the Python server does not listen on {addr.kind} addresses; put it behind udskit proxy --listen tls:HOST:PORT")
    if addr.kind == "tcp":
        host, port = addr.host_port()
        fam = socket.AF_INET6 if ":" in str(host) else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(backlog)
        except BaseException:
            s.close()
            raise
        h, p = s.getsockname()[:2]
        return Listener(s, Address("tcp", join_host_port(h, str(p))))
    if addr.kind == "abstract":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind(addr.sockaddr())
        except OSError as e:
            s.close()
            if e.errno == errno.EADDRINUSE:
                _, pid = _probe(addr.unix_path(), probe_timeout)
                who = f" (pid {pid})" if pid else ""
                raise ListenError("in_use", f"{addr} is in use by a live server{who}", pid) from e
            raise
        s.listen(backlog)
        return Listener(s, addr)

    path = addr.name
    n = len(os.fsencode(path))
    if n > MAX_PATH:
        raise ListenError(
            "path_too_long",
            f"socket path is {n} bytes, over the {MAX_PATH}-byte limit: use a shorter or relative path, or an abstract @name",
        )
    parent = os.path.dirname(os.path.abspath(path))
    if mkdir:
        _mkdirs(parent, dir_mode)
    lock = _lock(path)
    ok = False
    try:
        _clear_stale(path, probe_timeout)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            os.fchmod(s.fileno(), mode)  # the file is created with this mode (less the umask)
            try:
                s.bind(path)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise ListenError("in_use", f"{path} was taken by another process meanwhile") from e
                raise
            st = os.lstat(path)
            if stat.S_IMODE(st.st_mode) != mode:
                os.chmod(path, mode)  # the umask took bits away: set exactly mode (never looser than asked)
                st = os.lstat(path)
            s.listen(backlog)
        except BaseException:
            s.close()
            raise
        ok = True
        return Listener(s, addr, (st.st_dev, st.st_ino, st.st_ctime_ns))
    finally:
        if not ok:
            _unlink_lock_unless_socket(path, lock)
        os.close(lock)
