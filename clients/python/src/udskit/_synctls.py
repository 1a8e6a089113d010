"""tls: and ssh:// for the blocking client.

TLS runs on an ssl.SSLObject over memory BIOs, not an ssl.SSLSocket: the
client's reader thread and its writers use the connection at once, which an
SSLSocket (one OpenSSL object, entered from two threads) does not allow. Here
the SSLObject is only touched under ``lock`` and never while doing socket
I/O, and the TCP socket itself keeps the plain client's discipline
(non-blocking sends, poll, recv). Ciphertext is sent in the order it was made:
``out`` is drained by the one writer holding the connection's write lock, and
new plaintext is encrypted only once ``out`` is empty and the socket takes
bytes, so a request that cannot go out by its deadline is never encrypted
(the TLS stream cannot take a record back)."""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time

from ._addr import Address, split_ssh
from ._common import arm, connect_error
from ._errors import UNAVAILABLE, UdskitError
from ._ssh import Forward, SSHConfig, ssh_forward_sync
from ._tls import TLSConfig, check_spiffe, explain_tls

#: plaintext encrypted per send call (TLS cuts it into 16 KiB records)
CHUNK = 256 << 10


class TLSSock:
    """The parts of socket.socket the blocking client uses, over TLS."""

    def __init__(self, raw: socket.socket, obj: ssl.SSLObject, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO) -> None:
        self.raw, self.obj, self.incoming, self.outgoing = raw, obj, incoming, outgoing
        self.lock = threading.Lock()
        self.out = bytearray()  # ciphertext not yet sent (appended under lock; drained under the write lock)
        self.rbuf = b""  # plaintext decrypted and not yet returned
        self.eof = False
        self.family = raw.family
        self._wpoll = select.poll()
        self._wpoll.register(raw.fileno(), select.POLLOUT)

    def fileno(self) -> int:
        return self.raw.fileno()

    def settimeout(self, t: float | None) -> None:
        self.raw.settimeout(t)

    def shutdown(self, how: int) -> None:
        self.raw.shutdown(how)

    def close(self) -> None:
        self.raw.close()

    @property
    def unsent(self) -> bool:
        return bool(self.out)

    def _pull(self) -> None:  # lock held
        if self.outgoing.pending:
            self.out += self.outgoing.read()

    def flush_nowait(self) -> bool:
        """Sends what it can of out; True when out is empty."""
        while self.out:
            with self.lock:
                chunk = bytes(self.out[:CHUNK])
            try:
                n = self.raw.send(chunk, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return False
            with self.lock:
                del self.out[:n]
        return True

    def send(self, data: bytes | bytearray | memoryview, flags: int = 0) -> int:
        """Encrypts as much of data as goes now and sends what the socket takes; returns the
        plaintext bytes taken (committed to the stream: their ciphertext may still sit in
        out). BlockingIOError when nothing was taken."""
        if not self.flush_nowait() or not self._wpoll.poll(0):
            raise BlockingIOError("TLS: the socket takes nothing now")
        chunk = memoryview(data)[:CHUNK]
        with self.lock:
            n = self.obj.write(chunk)
            self._pull()
        self.flush_nowait()
        return n

    def sendall(self, data: bytes) -> None:
        """A blocking send (the socket's timeout applies), for the hello."""
        with self.lock:
            self.obj.write(data)
            self._pull()
            b, self.out = bytes(self.out), bytearray()
        self.raw.sendall(b)

    def _decrypt(self) -> bytes:
        """All plaintext the buffered ciphertext holds (lock held)."""
        parts = []
        while True:
            try:
                b = self.obj.read(262144)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.eof = True
                break
            if not b:
                self.eof = True
                break
            parts.append(b)
        self._pull()  # a key update answered, a close_notify
        return b"".join(parts)

    def recv_some(self, n: int) -> bytes | None:
        """Plaintext (at most n bytes if a hello is being read), b"" at the end of the stream,
        or None when the bytes read held no whole record yet. Blocks in recv on the TCP socket
        only when there is nothing decrypted to return: poll the fd first to bound it."""
        if not self.rbuf and not self.eof:
            data = self.raw.recv(262144)
            with self.lock:
                if data:
                    self.incoming.write(data)
                else:
                    self.incoming.write_eof()
                try:
                    self.rbuf = self._decrypt()
                except ssl.SSLEOFError:
                    self.eof = True
        if not self.rbuf:
            return b"" if self.eof else None
        b, self.rbuf = self.rbuf[:n], self.rbuf[n:]
        return b

    def recv(self, n: int) -> bytes:
        """Blocks (within the socket's timeout) for plaintext or the end of the stream."""
        while True:
            b = self.recv_some(n)
            if b is not None:
                return b


def dial_tls(addr: Address, tls: TLSConfig | None, deadline: float | None) -> TLSSock:
    """Connects to a tls: address and completes the TLS handshake by the deadline."""
    if tls is None:
        raise UdskitError("failed_precondition", f"connect {addr}: a tls: address needs tls=TLSConfig(...) (CA bundle, client certificate); there is no plaintext fallback")
    host, port = addr.host_port()
    ctx = tls.context()
    name = None if tls.server_spiffe_id is not None else (tls.server_name or host or "localhost")
    raw = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # One deadline for the TCP connect and the whole TLS handshake: each step is armed
        # with what is left of it (a per-recv timeout restarts with every record piece).
        until = time.monotonic() + 10.0 if deadline is None else deadline
        try:
            arm(raw, until)
            raw.connect((host, port))
        except OSError as e:
            raise connect_error(addr, e) from e
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = ctx.wrap_bio(incoming, outgoing, server_side=False, server_hostname=name or host)
        try:
            while True:
                try:
                    obj.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    if outgoing.pending:
                        arm(raw, until)
                        raw.sendall(outgoing.read())
                    arm(raw, until)
                    data = raw.recv(65536)
                    if not data:
                        raise UdskitError(UNAVAILABLE, f"connect {addr}: the server closed the connection during the TLS handshake (is it a TLS server?)") from None
                    incoming.write(data)
            if outgoing.pending:
                arm(raw, until)
                raw.sendall(outgoing.read())
        except socket.timeout:
            raise UdskitError("deadline_exceeded", f"connect {addr}: the TLS handshake did not finish within the connect timeout") from None
        except ssl.SSLError as e:
            why = explain_tls(e)
            raise UdskitError("unauthenticated", f"connect {addr}: {why or e}") from e
        except OSError as e:
            raise connect_error(addr, e) from e
        if tls.server_spiffe_id is not None:
            why = check_spiffe(obj.getpeercert(), tls.server_spiffe_id)
            if why is not None:
                raise UdskitError("unauthenticated", f"connect {addr}: {why}")
        return TLSSock(raw, obj, incoming, outgoing)
    except BaseException:
        raw.close()
        raise


def dial_ssh(addr: Address, cfg: SSHConfig | None, deadline: float | None) -> tuple[socket.socket, Forward]:
    """Starts ssh forwarding to an ssh:// address's remote socket and connects to it; the
    caller stops the Forward when the connection ends."""
    t = split_ssh(addr.name)
    timeout = 20.0 if deadline is None else max(deadline - time.monotonic(), 0.001)
    try:
        fwd = ssh_forward_sync(t.user, t.host, t.port, t.path, cfg or SSHConfig(), timeout)
    except RuntimeError as e:
        raise UdskitError(UNAVAILABLE, f"connect {addr}: {e}") from e
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(fwd.local)
    except OSError as e:
        s.close()
        fwd.stop()
        raise connect_error(addr, e) from e
    return s, fwd
