"""The udskit address syntax (protocol/addresses.json, docs/addresses.md)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

from ._errors import AddressError

MAX_ADDR_LEN = 4096
ABSTRACT_SUPPORTED = sys.platform.startswith("linux")

Kind = Literal["unix", "abstract", "tcp", "tls", "ssh"]


@dataclass(frozen=True)
class Address:
    """A parsed address. ``name`` is the path (unix), the abstract name
    without its '@' (abstract), or host:port (tcp, IPv6 hosts bracketed)."""

    kind: Kind
    name: str

    def __str__(self) -> str:
        if self.kind == "unix":
            return "unix:" + self.name
        if self.kind == "abstract":
            return "unix:@" + self.name
        if self.kind == "tls":
            return "tls:" + self.name
        if self.kind == "ssh":
            return "ssh://" + self.name
        return "tcp:" + self.name

    def sockaddr(self) -> str | bytes | tuple[str, int]:
        """The address in the form socket.connect/bind take."""
        if self.kind in ("tcp", "tls"):
            return self.host_port()
        if self.kind == "ssh":
            raise AddressError(str(self), "unsupported_here", "an ssh:// address is reached through ssh, not a socket address")
        return self.unix_path()

    def unix_path(self) -> str | bytes:
        """The path (str) or abstract name (bytes starting with NUL) of a unix address."""
        if self.kind == "abstract":
            return b"\0" + self.name.encode()
        return self.name

    def host_port(self) -> tuple[str, int]:
        """(host, port) of a tcp address; an empty host is 127.0.0.1."""
        host, port = split_host_port(self.name)
        return (host or "127.0.0.1", int(port))


def split_host_port(hostport: str) -> tuple[str, str]:
    """Go's net.SplitHostPort: host and port, brackets removed; ValueError on a bad form."""
    i = hostport.rfind(":")
    if i < 0:
        raise ValueError("missing port")
    j = k = 0
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            raise ValueError("missing ']'")
        if end + 1 == len(hostport):
            raise ValueError("missing port")
        if end + 1 != i:
            raise ValueError("too many colons" if hostport[end + 1] == ":" else "missing port")
        host = hostport[1:end]
        j, k = 1, end + 1
    else:
        host = hostport[:i]
        if ":" in host:
            raise ValueError("too many colons")
    if "[" in hostport[j:]:
        raise ValueError("unexpected '['")
    if "]" in hostport[k:]:
        raise ValueError("unexpected ']'")
    return host, hostport[i + 1 :]


def join_host_port(host: str, port: str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _scheme_like(s: str) -> str:
    i = s.find(":")
    if i <= 0:
        return ""
    word = s[:i]
    if not (word.isascii() and word.isalpha()):
        return ""
    rest = s[i + 1 :]
    if rest.startswith("/") or (":" in rest and not rest.startswith("[")):
        return word
    return ""


def _abstract(s: str, name: str) -> Address:
    if name == "":
        raise AddressError(s, "empty_abstract", "empty abstract name after @")
    if not ABSTRACT_SUPPORTED:
        raise AddressError(s, "abstract_unsupported", "abstract unix socket names (@name) exist only on Linux")
    return Address("abstract", name)


def _tcp(s: str, hostport: str) -> Address:
    try:
        host, port = split_host_port(hostport)
    except ValueError:
        raise AddressError(s, "bad_hostport", "want host:port, with [brackets] around IPv6 hosts") from None
    if not (1 <= len(port) <= 5 and port.isascii() and port.isdigit()) or int(port) > 65535:
        raise AddressError(s, "bad_port", f"port {port!r} is not a number from 0 to 65535")
    if " " in host or "/" in host:
        raise AddressError(s, "bad_host", f"host {host!r} is not a host name or IP")
    return Address("tcp", join_host_port(host, port))


def parse_addr(s: str) -> Address:
    """Parses any accepted address form; raises AddressError with a stable ``name``.
    Both the input and its canonical form are at most MAX_ADDR_LEN bytes, so the
    canonical form parses again."""
    a = _parse_form(s)
    n = len(str(a).encode("utf-8", "surrogatepass"))
    if n > MAX_ADDR_LEN:
        raise AddressError(s, "too_long", f"{n} bytes in canonical form, over the {MAX_ADDR_LEN}-byte limit")
    return a


def _parse_form(s: str) -> Address:
    if s == "":
        raise AddressError(s, "empty", "empty address")
    n = len(s.encode("utf-8", "surrogatepass"))
    if n > MAX_ADDR_LEN:
        raise AddressError(s, "too_long", f"{n} bytes, over the {MAX_ADDR_LEN}-byte limit")
    if "\0" in s:
        raise AddressError(s, "nul_byte", "contains a NUL byte")
    if s.startswith("unix:"):
        rest = s[5:]
        if rest.startswith("@"):
            return _abstract(s, rest[1:])
        if rest == "":
            raise AddressError(s, "empty_path", "empty socket path after unix:")
        return Address("unix", rest)
    if s.startswith("@"):
        return _abstract(s, s[1:])
    if s.startswith("tcp:"):
        return _tcp(s, s[4:])
    if s.startswith("tls:"):
        return Address("tls", _tcp(s, s[4:]).name)
    if s.startswith("ssh:"):
        if not s.startswith("ssh://"):
            raise AddressError(s, "bad_ssh", "want ssh://[user@]host[:port]/path/to.sock")
        return Address("ssh", _ssh_name(_split_ssh(s, s[6:])))
    scheme = _scheme_like(s)
    if scheme:
        raise AddressError(s, "unknown_scheme", f"unknown scheme {scheme!r}")
    if "/" in s:
        return Address("unix", s)
    if ":" in s:
        return _tcp(s, s)
    return Address("unix", s)


def as_address(addr: str | Address) -> Address:
    return addr if isinstance(addr, Address) else parse_addr(addr)


@dataclass(frozen=True)
class SSHTarget:
    """An ssh:// address taken apart; an empty user or port leaves the choice to ssh."""

    user: str
    host: str
    port: str
    path: str


def split_ssh(name: str) -> SSHTarget:
    """Splits the name of a parsed ssh address ("[user@]host[:port]/path")."""
    return _split_ssh("ssh://" + name, name)


def _ssh_name(t: SSHTarget) -> str:
    host = f"[{t.host}]" if ":" in t.host else t.host
    return (t.user + "@" if t.user else "") + host + (":" + t.port if t.port else "") + t.path


_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
_V6_CHARS = frozenset("0123456789abcdefABCDEF:.")


def _bad_port(p: str) -> bool:
    return not (1 <= len(p) <= 5 and p.isascii() and p.isdigit()) or not 1 <= int(p) <= 65535


def _split_ssh(s: str, rest: str) -> SSHTarget:
    slash = rest.find("/")
    if slash < 0:
        raise AddressError(s, "bad_ssh", "ssh:// wants a remote socket path: ssh://[user@]host[:port]/path/to.sock")
    auth, path = rest[:slash], rest[slash:]
    user = port = ""
    at = auth.rfind("@")
    if at >= 0:
        user, auth = auth[:at], auth[at + 1 :]
        if user == "" or user[0] == "-" or any(not 0x21 <= ord(c) <= 0x7E or c in ":/" for c in user):
            raise AddressError(s, "bad_user", f"ssh user {user!r}: want printable characters without ':' or '/', not starting with '-'")
    if auth.startswith("["):
        end = auth.find("]")
        if end < 0:
            raise AddressError(s, "bad_host", "missing ']' after an IPv6 host")
        host = auth[1:end]
        if host == "" or any(c not in _V6_CHARS for c in host):
            raise AddressError(s, "bad_host", f"host {host!r} in brackets is not an IPv6 address")
        after = auth[end + 1 :]
        if after and not after.startswith(":"):
            raise AddressError(s, "bad_host", "unexpected text after ']'")
        if after:
            port = after[1:]
            if _bad_port(port):
                raise AddressError(s, "bad_port", f"port {port!r} is not a number from 1 to 65535")
    else:
        host = auth
        i = auth.rfind(":")
        if i >= 0:
            host, port = auth[:i], auth[i + 1 :]
            if ":" in host:
                raise AddressError(s, "bad_host", "an IPv6 host needs [brackets]")
            if _bad_port(port):
                raise AddressError(s, "bad_port", f"port {port!r} is not a number from 1 to 65535")
        if host == "" or host[0] == "-" or any(c not in _HOST_CHARS for c in host):
            raise AddressError(s, "bad_host", f"host {host!r}: want a host name (letters, digits, '.', '-', '_', not starting with '-') or [IPv6]")
    if len(path.encode("utf-8", "surrogatepass")) > 107:
        raise AddressError(s, "bad_ssh_path", "remote socket path is over the 107 bytes a socket path may have")
    if any(ord(c) < 0x20 or ord(c) == 0x7F or c == ":" for c in path):
        raise AddressError(s, "bad_ssh_path", "remote socket path has ':' or a control character (OpenSSH's forwarding syntax cannot carry it)")
    return SSHTarget(user, host, port, path)
