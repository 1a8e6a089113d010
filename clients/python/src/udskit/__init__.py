"""udskit for Python: fast, safe local RPC over unix sockets, byte-compatible
with the Go implementation (protocol/spec.md).

Async client::

    c = await udskit.connect("/run/app.sock", wait=True, timeout=5)
    print(await c.call("echo", {"hi": 1}, timeout=2))
    async for item in c.stream("stream", {"n": 3}):
        print(item)
    await c.aclose()

Sync client (thread-safe)::

    with udskit.Client("/run/app.sock") as c:
        print(c.call("echo", {"hi": 1}, timeout=2))

Server::

    srv = await udskit.serve("/run/app.sock", {"echo": echo}, policy=udskit.allow_uids(0))
    await srv.serve_forever()
"""

from ._addr import Address, parse_addr
from ._bidi import BidiCall, ClientStreamCall
from ._bidi_srv import Requests, bidi, client_stream
from ._client import AsyncClient, Stream, connect
from ._errors import CODES, AddressError, ListenError, ProtocolError, UdskitError
from ._intercept import (
    ClientCall,
    StreamClientInterceptor,
    StreamServerInterceptor,
    SyncClientInterceptor,
    UnaryClientInterceptor,
    UnaryServerInterceptor,
)
from ._ndjson import NDJSONClient, connect_ndjson
from ._server import (
    Context,
    Peer,
    PeerCred,
    PeerPolicy,
    Policy,
    Server,
    all_peers,
    allow_any_verified,
    allow_dns,
    allow_same_user,
    allow_spiffe,
    allow_uids,
    any_peer,
    raw,
    serve,
)
from ._stats import ServerStats, ShmServerStats, afetch_stats, fetch_stats, parse_stats
from ._sync import Client, SyncStream
from ._bidi_sync import SyncBidiCall, SyncClientStreamCall
from ._ssh import SSHConfig
from ._tls import RemotePeer, ServerTLSConfig, TLSConfig

__version__ = "0.1.0"

__all__ = [
    "TLSConfig",
    "SSHConfig",
    "ServerTLSConfig",
    "RemotePeer",
    "Address",
    "AddressError",
    "AsyncClient",
    "BidiCall",
    "ClientStreamCall",
    "Requests",
    "bidi",
    "client_stream",
    "CODES",
    "Client",
    "ClientCall",
    "UnaryClientInterceptor",
    "StreamClientInterceptor",
    "UnaryServerInterceptor",
    "StreamServerInterceptor",
    "SyncClientInterceptor",
    "Context",
    "ListenError",
    "NDJSONClient",
    "Peer",
    "PeerCred",
    "PeerPolicy",
    "Policy",
    "ProtocolError",
    "Server",
    "Stream",
    "SyncStream",
    "SyncBidiCall",
    "SyncClientStreamCall",
    "UdskitError",
    "all_peers",
    "allow_any_verified",
    "allow_dns",
    "allow_same_user",
    "allow_spiffe",
    "allow_uids",
    "any_peer",
    "connect",
    "connect_ndjson",
    "parse_addr",
    "raw",
    "serve",
    "ServerStats",
    "ShmServerStats",
    "afetch_stats",
    "fetch_stats",
    "parse_stats",
]
