"""Randomised, bounded decoder and server tests (fixed seeds): hostile input only
ever raises the package's ProtocolError, and costs only its own connection."""

from __future__ import annotations

import json
import random
import socket
from typing import Any, Callable

import udskit
from conftest import PROTOCOL, ThreadServer
from udskit import _wire
from udskit._errors import ProtocolError
from udskit._ndjson import parse_ndjson_request

FRAMES = json.loads((PROTOCOL / "vectors/frames.json").read_text())
SEEDS = [bytes.fromhex(v["hex"]) for v in FRAMES["valid"] + FRAMES["invalid"]]


def mutate(rng: random.Random, b: bytes) -> bytes:
    ba = bytearray(b)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(4)
        if op == 0 and ba:
            ba[rng.randrange(len(ba))] = rng.randrange(256)
        elif op == 1:
            ba[rng.randrange(len(ba) + 1) : 0] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2 and ba:
            i = rng.randrange(len(ba))
            del ba[i : i + rng.randint(1, 8)]
        else:
            ba += rng.choice(SEEDS)
    return bytes(ba)


def test_frame_decoder_random_input() -> None:
    rng = random.Random(1)
    for _ in range(3000):
        data = mutate(rng, rng.choice(SEEDS))
        d = _wire.FrameDecoder(lambda *a: None, rng.choice([1024, 1 << 24]))
        try:
            i = 0
            while i < len(data):
                n = rng.randint(1, 20)
                d.feed(data[i : i + n])
                i += n
        except ProtocolError as e:
            assert e.name in udskit._errors.PROTOCOL_ERROR_NAMES
        assert d.buffered <= 16 + 16384 + (1 << 24)
        try:
            _wire.decode_frame(data, 1 << 24)
        except ProtocolError:
            pass


def test_hello_and_ndjson_random_input() -> None:
    rng = random.Random(2)
    hello = bytes.fromhex("5544534b010100000000000100000000")
    lines = [b'{"id":1,"func":"f","data":{"a":[1,2,{"b":null}]}}', b'{"id":"x","func":"g"}']
    for _ in range(3000):
        try:
            _wire.decode_hello(mutate(rng, hello)[:16])
        except ProtocolError:
            pass
        try:
            parse_ndjson_request(mutate(rng, rng.choice(lines)))
        except ProtocolError as e:
            assert e.name == "bad_request"


def test_server_survives_random_connections(py_server: Callable[..., ThreadServer]) -> None:
    s = py_server()
    rng = random.Random(3)
    hello = bytes.fromhex("5544534b010100000000000100000000")
    for i in range(60):
        junk = mutate(rng, rng.choice(SEEDS))
        sk = socket.socket(socket.AF_UNIX)
        sk.settimeout(5)
        sk.connect(s.path)
        try:
            sk.sendall((hello if i % 4 else b"") + junk)
            sk.shutdown(socket.SHUT_WR)
            while sk.recv(65536):
                pass
        except OSError:
            pass
        finally:
            sk.close()
    with udskit.Client(s.path) as c:
        assert c.call("echo", {"still": "fine"}, timeout=5) == {"still": "fine"}
    # an unknown frame type is skipped, not an error
    sk = socket.socket(socket.AF_UNIX)
    sk.connect(s.path)
    sk.sendall(hello + bytes.fromhex("c880020000000000010000000000000078797a") + _wire.frame(1, 0, 5, 0, _wire.method_head("echo"), b"1"))
    sk.settimeout(5)
    got = b""
    while len(got) < 16 + 17:
        got += sk.recv(100)
    f, _ = _wire.decode_frame(got[16:], 1 << 24)
    assert (f.type, f.id, f.payload) == (2, 5, b"1")
    sk.close()


def test_ping_pong(py_server: Callable[..., ThreadServer]) -> None:
    import asyncio

    s = py_server()

    async def main() -> Any:
        async with await udskit.connect(s.path) as c:
            return await c.ping()

    assert 0 <= asyncio.run(main()) < 5
