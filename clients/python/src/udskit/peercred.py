"""Kernel credentials of the peer of a plain asyncio (or socket) unix-socket server.

For servers that are not udskit servers (an ``asyncio.start_unix_server`` handler, an
aiohttp app on a unix socket...): the caller's pid/uid/gid from SO_PEERCRED (Linux), and
udskit's policies (``udskit.allow_uids``, ``udskit.allow_same_user``) applied to them::

    async def handle(reader, writer):
        cred = peercred.require(writer, udskit.allow_uids(0, 1000))  # PermissionError if refused
        ...

    await asyncio.start_unix_server(handle, path)

The pid is an observation, not an identity (pids are reused): authorize on uid/gid.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Union

from ._handler import PeerCred, Policy
from ._listen import peer_cred as _sock_cred

__all__ = ["PeerCred", "peer_cred", "require"]

Source = Union[asyncio.StreamWriter, asyncio.BaseTransport, socket.socket]


def _socket_of(src: Source) -> socket.socket | None:
    if isinstance(src, socket.socket):
        return src
    if isinstance(src, asyncio.StreamWriter):
        src = src.transport
    sock = src.get_extra_info("socket")
    # asyncio hands out a TransportSocket wrapper; it carries family and getsockopt.
    return sock  # type: ignore[no-any-return]


def peer_cred(src: Source) -> PeerCred | None:
    """The peer's credentials: ``PeerCred(pid, uid, gid)``, or None when the connection is
    not a unix socket (TCP) or the platform has no SO_PEERCRED."""
    sock = _socket_of(src)
    if sock is None:
        return None
    try:
        c = _sock_cred(sock)
    except OSError:
        return None
    return None if c is None else PeerCred(*c)


def require(src: Source, policy: Policy) -> PeerCred:
    """The peer's credentials if ``policy`` admits them; PermissionError otherwise (also for a
    peer without kernel credentials). Close the connection on PermissionError."""
    cred = peer_cred(src)
    if cred is None:
        raise PermissionError("peer refused: no kernel credentials (not a unix socket)")
    if not policy(cred):
        raise PermissionError(f"peer refused by policy: pid={cred.pid} uid={cred.uid} gid={cred.gid}")
    return cred
