"""Every vector of protocol/: frames, hellos, negotiation, NDJSON, codes, addresses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import PROTOCOL
from udskit import _errors, _wire
from udskit._addr import parse_addr
from udskit._common import parse_md
from udskit._errors import AddressError, ProtocolError, UdskitError
from udskit._ndjson import ndjson_error_line, ndjson_response_line, parse_ndjson_request


def load(name: str) -> Any:
    return json.loads((PROTOCOL / name).read_text())


FRAMES = load("vectors/frames.json")
HELLOS = load("vectors/hello.json")
NDJSON = load("vectors/ndjson.json")
CODES = load("codes.json")
ADDRS = load("addresses.json")


def ids(vs: list[dict[str, Any]]) -> list[str]:
    return [v.get("name", v.get("input", "?"))[:60] for v in vs]


@pytest.mark.parametrize("v", FRAMES["valid"], ids=ids(FRAMES["valid"]))
def test_frame_valid(v: dict[str, Any]) -> None:
    b = bytes.fromhex(v["hex"])
    f, n = _wire.decode_frame(b, FRAMES["max_frame"])
    assert n == len(b)
    assert (f.type, f.type_name, f.flags, f.id, f.aux) == (v["type"], v["type_name"], v["flags"], v["id"], v["aux"])
    assert f.head.hex() == v["head_hex"] and f.payload.hex() == v["payload_hex"]
    if "method" in v:
        method, md = _wire.parse_request_head(f.head)
        assert method == v["method"] and [list(x) for x in md] == v["metadata"]
        # the entries re-encoded in wire order (repeats and reserved keys too) give the head back
        assert _wire.method_head(method) + _wire.encode_entries(md) == f.head
        if len(dict(md)) == len(md) and not any(k.startswith(":") for k, _ in md):
            assert _wire.request_head(method, dict(md)) == f.head
    elif "metadata" in v:
        assert [list(x) for x in _wire.iter_metadata(f.head)] == v["metadata"]
    if "code" in v:
        assert _errors.CODE_NAMES[f.aux] == v["code_name"] and f.head.decode() == v["message"]
    if v["type_name"] == "goaway":
        assert f.head.decode() == v["message"]
    # encoding the decoded fields gives the same bytes
    assert _wire.frame(f.type, f.flags, f.id, f.aux, f.head, f.payload) == b


APP_MD = [v for v in FRAMES["valid"] if "app_metadata" in v]


def test_app_metadata_wherever_metadata() -> None:
    """Every valid vector with wire metadata says what the application sees, and
    some of them hide reserved keys (so test_frame_app_metadata checks the dropping)."""
    assert all(("metadata" in v) == ("app_metadata" in v) for v in FRAMES["valid"])
    hidden = [v for v in APP_MD if any(k.startswith(":") for k, _ in v["metadata"])]
    assert len(hidden) >= 4 and any(v["type_name"] == "request" for v in hidden) and any(v["type_name"] == "response" for v in hidden)


@pytest.mark.parametrize("v", APP_MD, ids=ids(APP_MD))
def test_frame_app_metadata(v: dict[str, Any]) -> None:
    """The metadata the application sees (spec 3.1: keys starting with ':' dropped,
    a repeated key's last value): a handler's ctx.metadata for a request (the
    server's parse_request), a client's stream trailer for a response head (parse_md)."""
    f, _ = _wire.decode_frame(bytes.fromhex(v["hex"]), FRAMES["max_frame"])
    if f.type == _wire.T_REQUEST:
        method, md = _wire.parse_request(f.head)
        assert method == v["method"]
    else:
        md = parse_md(f.head)
    assert md == v["app_metadata"]
    # the wire view keeps everything, in order
    wire = _wire.parse_request_head(f.head)[1] if f.type == _wire.T_REQUEST else _wire.iter_metadata(f.head)
    assert [list(x) for x in wire] == v["metadata"]
    # an application may not send a reserved key: refused before anything is encoded
    reserved = [k for k, _ in wire if k.startswith(":")]
    if reserved:
        with pytest.raises(UdskitError) as ei:
            _wire.request_head("echo", dict(wire))
        assert ei.value.code == "invalid_argument" and repr(reserved[0]) in ei.value.message
        assert "reserved for the protocol" in ei.value.message


@pytest.mark.parametrize("v", FRAMES["valid"], ids=ids(FRAMES["valid"]))
def test_frame_valid_incremental(v: dict[str, Any]) -> None:
    """The streaming decoder gives the same frame fed one byte at a time, and twice in one read."""
    b = bytes.fromhex(v["hex"])
    got: list[tuple[Any, ...]] = []
    d = _wire.FrameDecoder(lambda *a: got.append(a), FRAMES["max_frame"])
    for i in range(len(b)):
        d.feed(b[i : i + 1])
    d.feed(b + b)
    want = (v["type"], v["flags"], v["id"], v["aux"], bytes.fromhex(v["head_hex"]), bytes.fromhex(v["payload_hex"]))
    assert got == [want, want, want]
    assert d.buffered == 0


@pytest.mark.parametrize("v", FRAMES["invalid"], ids=ids(FRAMES["invalid"]))
def test_frame_invalid(v: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as ei:
        _wire.decode_frame(bytes.fromhex(v["hex"]), v["max_frame"])
    assert ei.value.name == v["error"]


@pytest.mark.parametrize("v", [v for v in FRAMES["invalid"] if v["error"] in ("frame_too_large", "head_too_large")], ids=str)
def test_decoder_refuses_before_buffering(v: dict[str, Any]) -> None:
    """A header over the limits fails as soon as its 16 bytes are in, with nothing buffered."""
    d = _wire.FrameDecoder(lambda *a: None, v["max_frame"])
    with pytest.raises(ProtocolError) as ei:
        d.feed(bytes.fromhex(v["hex"])[:16])
    assert ei.value.name == v["error"] and d.buffered == 0


@pytest.mark.parametrize("v", HELLOS["valid"], ids=ids(HELLOS["valid"]))
def test_hello_valid(v: dict[str, Any]) -> None:
    h = _wire.decode_hello(bytes.fromhex(v["hex"]))
    assert (h.version, h.flags, h.max_frame, h.max_in_flight) == (v["version"], v["flags"], v["max_frame"], v["max_in_flight"])


@pytest.mark.parametrize("v", HELLOS["invalid"], ids=ids(HELLOS["invalid"]))
def test_hello_invalid(v: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as ei:
        _wire.decode_hello(bytes.fromhex(v["hex"]))
    assert ei.value.name == v["error"]


@pytest.mark.parametrize("v", HELLOS["negotiate"], ids=ids(HELLOS["negotiate"]))
def test_negotiate(v: dict[str, Any]) -> None:
    n = _wire.negotiate(_wire.decode_hello(bytes.fromhex(v["client"])), _wire.decode_hello(bytes.fromhex(v["server"])))
    assert (n.version, n.max_frame, n.max_in_flight, n.features) == (v["version"], v["max_frame"], v["max_in_flight"], v["features"])


def test_our_hellos_offer_stream_credit() -> None:
    # flags 0x03: stream_credit and client_stream (spec 4.3), client and server alike
    assert _wire.Hello().encode().hex() == "5544534b010300000000000100000000"
    assert _wire.Hello(max_in_flight=4096).encode().hex() == "5544534b010300000000000100100000"


@pytest.mark.parametrize("v", NDJSON["requests"], ids=ids(NDJSON["requests"]))
def test_ndjson_request(v: dict[str, Any]) -> None:
    r = parse_ndjson_request(v["line"].encode())
    assert r.id_text.decode() == v["id"] and r.func == v["func"] and r.data_text.decode() == v["data"]


@pytest.mark.parametrize("v", NDJSON["invalid"], ids=ids(NDJSON["invalid"]))
def test_ndjson_invalid(v: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as ei:
        parse_ndjson_request(v["line"].encode())
    assert ei.value.name == v["error"] and ei.value.code == "invalid_argument"
    assert ei.value.id_text.decode() == v["id"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("v", NDJSON["responses"], ids=ids(NDJSON["responses"]))
def test_ndjson_response(v: dict[str, Any]) -> None:
    if "error" in v:
        line = ndjson_error_line(v["id"].encode(), v["error"], v["code"])
    else:
        line = ndjson_response_line(v["id"].encode(), v["data"].encode())
    assert line.decode() == v["line"]


def test_codes_match_codes_json() -> None:
    table = {c["name"]: c["code"] for c in CODES["codes"]}
    assert table == _errors.CODES
    for c in CODES["codes"]:
        if c["code"]:
            e = _errors.UdskitError(c["code"], "m")
            assert (e.code, e.number, e.retryable) == (c["name"], c["code"], c["retryable"])
    assert {p["name"] for p in CODES["protocol_errors"]} == _errors.PROTOCOL_ERROR_NAMES
    # unknown codes are accepted, keep their number, and are not retryable
    e = _errors.UdskitError(77, "x")
    assert (e.number, e.code, e.retryable) == (77, "code_77", False)
    # refused is flag bit 0 of an error frame
    assert CODES["refused"]["flag_bit"] == 0 and _wire.FLAG_REFUSED == 1


@pytest.mark.parametrize("v", ADDRS["valid"], ids=ids(ADDRS["valid"]))
def test_address_valid(v: dict[str, Any]) -> None:
    a = parse_addr(v["input"])
    assert (a.kind, a.name, str(a)) == (v["kind"], v["name"], v["canonical"])
    assert parse_addr(str(a)) == a


@pytest.mark.parametrize("v", ADDRS["invalid"], ids=ids(ADDRS["invalid"]))
def test_address_invalid(v: dict[str, Any]) -> None:
    s = v["input"] if "input" in v else v["input_repeat"]["text"] * v["input_repeat"]["count"]
    with pytest.raises(AddressError) as ei:
        parse_addr(s)
    assert ei.value.name == v["error"]
    assert ei.value.name in ADDRS["errors"]


@pytest.mark.parametrize("v", [v for v in ADDRS["valid"] if v["kind"] == "ssh"], ids=ids([v for v in ADDRS["valid"] if v["kind"] == "ssh"]))
def test_address_ssh_parts(v: dict[str, Any]) -> None:
    from udskit._addr import SSHTarget, split_ssh

    assert split_ssh(parse_addr(v["input"]).name) == SSHTarget(**v["ssh"])
