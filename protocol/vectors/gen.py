#!/usr/bin/env python3
"""Regenerates the udskit protocol vectors from protocol/spec.md, with only the
Python standard library (an independent encoder: the Go tests check the Go
decoder against what this writes). Run: python3 protocol/vectors/gen.py"""
import json, os, struct

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_FRAME = 16 << 20
TYPES = {1: "request", 2: "response", 3: "error", 4: "cancel", 5: "stream_data",
         6: "stream_end", 7: "ping", 8: "pong", 9: "goaway", 10: "stream_credit",
         11: "request_data", 12: "request_end", 13: "request_credit"}


def header(typ, flags, head_len, id_, payload_len, aux):
    return struct.pack("<BBHIII", typ, flags, head_len, id_, payload_len, aux)


def md(pairs):
    out = b""
    for k, v in pairs:
        k, v = k.encode(), v.encode()
        out += struct.pack("<H", len(k)) + k + struct.pack("<H", len(v)) + v
    return out


def req_head(method, pairs=()):
    m = method.encode()
    return struct.pack("<H", len(m)) + m + md(pairs)


def frame(typ, id_, head=b"", payload=b"", flags=0, aux=0):
    return header(typ, flags, len(head), id_, len(payload), aux) + head + payload


def app_metadata(pairs):
    """What an application sees (spec 3.1): reserved keys (":...") dropped, and
    of a key appearing twice the last one wins."""
    out = {}
    for k, v in pairs:
        if not k.startswith(":"):
            out[k] = v
    return out


def pad_entry(n):
    """A :pad entry of exactly n bytes (n >= 8), value all zeros."""
    return (":pad", "\0" * (n - 8))


def valid(name, typ, id_, head=b"", payload=b"", flags=0, aux=0, **decoded):
    v = {"name": name, "hex": frame(typ, id_, head, payload, flags, aux).hex(),
         "type": typ, "type_name": TYPES.get(typ, "type_%d" % typ), "flags": flags, "id": id_,
         "aux": aux, "head_hex": head.hex(), "payload_hex": payload.hex()}
    v.update(decoded)
    if "metadata" in v:
        v["app_metadata"] = app_metadata(v["metadata"])
    return v


# A request for "echo" padded so that header + head is 64 bytes: 16 + 6 + 42.
PAD_REQ = [pad_entry(64 - 16 - 6)]
# A response with one entry padded to 64: 16 + 6 ("k"="v") + 42.
PAD_RESP = [("k", "v"), pad_entry(64 - 16 - 6)]


frames_valid = [
    valid("request, no metadata, no deadline", 1, 1, req_head("echo"), b"hello",
          method="echo", metadata=[]),
    valid("request with metadata and a 250ms deadline", 1, 7, req_head("getService", [("trace", "abc"), ("tenant", "")]),
          b'{"service":"barista"}', aux=250000, method="getService", metadata=[["trace", "abc"], ["tenant", ""]]),
    valid("stream request (flag 1), empty payload", 1, 0xFFFFFFFF, req_head("count"), flags=1,
          method="count", metadata=[]),
    valid("response", 2, 1, b"", b"hello"),
    valid("response with metadata", 2, 2, md([("k", "v")]), b"", metadata=[["k", "v"]]),
    valid("request padded with :pad so its payload starts at byte 64", 1, 8, req_head("echo", PAD_REQ), b"aligned",
          method="echo", metadata=[list(p) for p in PAD_REQ]),
    valid("response with metadata and :pad (hidden from the application)", 2, 8, md(PAD_RESP), b"aligned",
          metadata=[list(p) for p in PAD_RESP]),
    valid("smallest :pad entry (8 bytes), empty value", 2, 9, md([(":pad", "")]), b"x",
          metadata=[[":pad", ""]]),
    valid("unknown reserved key is hidden; a repeated key: the last one wins", 1, 10,
          req_head("echo", [("trace", "a"), (":future", "1"), ("trace", "b")]), b"",
          method="echo", metadata=[["trace", "a"], [":future", "1"], ["trace", "b"]]),
    valid("error with message and details", 3, 1, b'unknown method "nope"', b'{"hint":1}', aux=12,
          code=12, code_name="unimplemented", message='unknown method "nope"'),
    valid("refused error (flag 1), retryable", 3, 9, b"server is shutting down", b"", flags=1, aux=14,
          code=14, code_name="unavailable", message="server is shutting down"),
    valid("connection-level error (id 0)", 3, 0, b"too many calls in flight", b"", aux=8,
          code=8, code_name="resource_exhausted", message="too many calls in flight"),
    valid("cancel", 4, 5),
    valid("cancel because the deadline passed", 4, 6, aux=4),
    valid("stream data", 5, 3, b"", b"\x00\x01\x02"),
    valid("stream end", 6, 3),
    valid("ping with opaque aux and payload", 7, 0, b"", b"abc", aux=42),
    valid("pong", 8, 0, b"", b"abc", aux=42),
    valid("goaway", 9, 0, b"draining", message="draining"),
    valid("stream credit: 512 KiB more for call 3", 10, 3, aux=512 << 10),
    # Client streams (spec 4.3).
    valid("bidi request (flags stream|client_stream = 0x03), empty payload", 1, 5, req_head("sum"), flags=3,
          method="sum", metadata=[]),
    valid("client-streaming request (flag client_stream = 0x02) with a 1s deadline", 1, 6, req_head("upload", [("k", "v")]),
          flags=2, aux=1000000, method="upload", metadata=[["k", "v"]]),
    valid("request data: one item of call 5", 11, 5, b"", b"42"),
    valid("request data: an empty item", 11, 5),
    valid("request end: no more items on call 5", 12, 5),
    valid("request credit: 512 KiB more for call 5", 13, 5, aux=512 << 10),
    valid("unknown type 200 is skipped, not an error", 200, 0, b"xy", b"z", flags=0x80),
    valid("unknown type 16 (after shm_release, section 10) is skipped", 16, 3, b"", b"q"),
]

inv = []


def invalid(name, data, error, max_frame=MAX_FRAME):
    inv.append({"name": name, "hex": data.hex(), "max_frame": max_frame, "error": error})


invalid("empty input", b"", "truncated")
invalid("half a header", header(2, 0, 0, 1, 5, 0)[:9], "truncated")
invalid("header then half the payload", frame(2, 1, b"", b"hello")[:-2], "truncated")
invalid("4 GiB payload length", header(2, 0, 0, 1, 0xFFFFFFFF, 0), "frame_too_large")
invalid("payload one over a negotiated 1024", header(2, 0, 0, 1, 1025, 0), "frame_too_large", 1024)
invalid("head over 16 KiB", header(1, 0, 16385, 1, 0, 0), "head_too_large")
invalid("request with id 0", frame(1, 0, req_head("echo")), "bad_id")
invalid("response with id 0", frame(2, 0), "bad_id")
invalid("stream data with id 0", frame(5, 0), "bad_id")
invalid("ping with nonzero id", frame(7, 3), "bad_id")
invalid("goaway with nonzero id", frame(9, 1), "bad_id")
invalid("stream credit with id 0", frame(10, 0, aux=1024), "bad_id")
invalid("request data with id 0", frame(11, 0, b"", b"1"), "bad_id")
invalid("request end with id 0", frame(12, 0), "bad_id")
invalid("request credit with id 0", frame(13, 0, aux=1024), "bad_id")
invalid("request data over a negotiated 1024", header(11, 0, 0, 5, 1025, 0), "frame_too_large", 1024)
invalid("error with code 0", frame(3, 1, b"x", aux=0), "bad_code")
invalid("request without a method length", frame(1, 1, b"\x04"), "bad_head")
invalid("request with an empty method", frame(1, 1, struct.pack("<H", 0)), "bad_head")
invalid("method length overruns head", frame(1, 1, struct.pack("<H", 9) + b"echo"), "bad_head")
invalid("metadata key cut short", frame(1, 1, req_head("echo") + b"\x05"), "bad_head")
invalid("metadata with empty key", frame(1, 1, req_head("echo") + struct.pack("<HH", 0, 0)), "bad_head")
invalid("metadata value overruns head", frame(1, 1, req_head("echo") + struct.pack("<H", 1) + b"k" + struct.pack("<H", 50)), "bad_head")
invalid("response metadata overruns head", frame(2, 1, struct.pack("<H", 3) + b"k"), "bad_head")

with open(os.path.join(HERE, "frames.json"), "w") as f:
    json.dump({"max_frame": MAX_FRAME, "valid": frames_valid, "invalid": inv}, f, indent=1)
    f.write("\n")


def hello(version, flags, max_frame, max_inflight, magic=b"UDSK", reserved=0):
    return magic + struct.pack("<BBHII", version, flags, reserved, max_frame, max_inflight)


hv = [
    {"name": "client hello, defaults", "hex": hello(1, 0, MAX_FRAME, 0).hex(), "version": 1, "flags": 0, "max_frame": MAX_FRAME, "max_in_flight": 0},
    {"name": "server hello", "hex": hello(1, 0, MAX_FRAME, 4096).hex(), "version": 1, "flags": 0, "max_frame": MAX_FRAME, "max_in_flight": 4096},
    {"name": "client hello offering stream credit (flag 1)", "hex": hello(1, 1, MAX_FRAME, 0).hex(), "version": 1, "flags": 1, "max_frame": MAX_FRAME, "max_in_flight": 0},
    {"name": "server hello with stream_credit and client_stream (flags 0x03)", "hex": hello(1, 3, MAX_FRAME, 4096).hex(), "version": 1, "flags": 3, "max_frame": MAX_FRAME, "max_in_flight": 4096},
    {"name": "unknown flags and reserved bits are ignored", "hex": hello(1, 0xFF, 1024, 1, reserved=0xBEEF).hex(), "version": 1, "flags": 255, "max_frame": 1024, "max_in_flight": 1},
    {"name": "a newer version parses; negotiation settles it", "hex": hello(7, 0, MAX_FRAME, 0).hex(), "version": 7, "flags": 0, "max_frame": MAX_FRAME, "max_in_flight": 0},
]
hi = [
    {"name": "empty", "hex": "", "error": "truncated"},
    {"name": "magic only", "hex": b"UDSK".hex(), "error": "truncated"},
    {"name": "newline JSON is not a hello", "hex": b'{"id":1,"func":"x"}\n'.hex(), "error": "bad_magic"},
    {"name": "HTTP/2 preface is not a hello", "hex": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".hex(), "error": "bad_magic"},
    {"name": "lowercase magic", "hex": hello(1, 0, MAX_FRAME, 0, magic=b"udsk").hex(), "error": "bad_magic"},
    {"name": "version 0", "hex": hello(0, 0, MAX_FRAME, 0).hex(), "error": "bad_version"},
    {"name": "max frame under 1024", "hex": hello(1, 0, 1023, 0).hex(), "error": "bad_limits"},
]
neg = [
    {"name": "smaller max frame wins, server sets in-flight", "client": hello(1, 0, 1 << 20, 0).hex(), "server": hello(1, 0, MAX_FRAME, 4096).hex(),
     "version": 1, "max_frame": 1 << 20, "max_in_flight": 4096, "features": 0},
    {"name": "newer client, v1 server: v1", "client": hello(3, 0, MAX_FRAME, 0).hex(), "server": hello(1, 0, 4096, 16).hex(),
     "version": 1, "max_frame": 4096, "max_in_flight": 16, "features": 0},
    {"name": "stream credit used: both set flag 1", "client": hello(1, 1, MAX_FRAME, 0).hex(), "server": hello(1, 1, MAX_FRAME, 4096).hex(),
     "version": 1, "max_frame": MAX_FRAME, "max_in_flight": 4096, "features": 1},
    {"name": "client streams available: both set flags 0x03", "client": hello(1, 3, MAX_FRAME, 0).hex(), "server": hello(1, 3, MAX_FRAME, 4096).hex(),
     "version": 1, "max_frame": MAX_FRAME, "max_in_flight": 4096, "features": 3},
    {"name": "old server without client_stream: the client must not open client streams", "client": hello(1, 3, MAX_FRAME, 0).hex(), "server": hello(1, 1, MAX_FRAME, 4096).hex(),
     "version": 1, "max_frame": MAX_FRAME, "max_in_flight": 4096, "features": 1},
    {"name": "stream credit not used: only the client sets it; unknown flags ignored", "client": hello(1, 0x81, MAX_FRAME, 0).hex(), "server": hello(1, 0, MAX_FRAME, 4096).hex(),
     "version": 1, "max_frame": MAX_FRAME, "max_in_flight": 4096, "features": 0},
]
with open(os.path.join(HERE, "hello.json"), "w") as f:
    json.dump({"valid": hv, "invalid": hi, "negotiate": neg}, f, indent=1)
    f.write("\n")

nd_valid = [
    {"name": "seed 002 request", "line": '{"id":1,"func":"getService","data":{"service":"barista"}}', "id": "1", "func": "getService", "data": '{"service":"barista"}'},
    {"name": "pretty spacing, key order", "line": ' { "data" : [1,2] , "func" : "f", "id" : 131070 } ', "id": "131070", "func": "f", "data": "[1,2]"},
    {"name": "string id, no data", "line": '{"id":"a-1","func":"ping"}', "id": '"a-1"', "func": "ping", "data": ""},
    {"name": "null data is no data", "line": '{"id":0,"func":"ping","data":null}', "id": "0", "func": "ping", "data": ""},
    {"name": "unknown fields are ignored", "line": '{"id":2,"func":"f","data":1,"extra":true}', "id": "2", "func": "f", "data": "1"},
]
nd_invalid = [
    {"name": "not JSON", "line": "hello", "error": "bad_request", "id": "null"},
    {"name": "truncated object", "line": '{"id":1,"func":"f"', "error": "bad_request", "id": "1"},
    {"name": "missing id", "line": '{"func":"f","data":{}}', "error": "bad_request", "id": "null"},
    {"name": "null id", "line": '{"id":null,"func":"f"}', "error": "bad_request", "id": "null"},
    {"name": "object id", "line": '{"id":{},"func":"f"}', "error": "bad_request", "id": "null"},
    {"name": "missing func", "line": '{"id":1,"data":{}}', "error": "bad_request", "id": "1"},
    {"name": "empty func", "line": '{"id":1,"func":""}', "error": "bad_request", "id": "1"},
    {"name": "func not a string", "line": '{"id":1,"func":5}', "error": "bad_request", "id": "1"},
    {"name": "array, not object", "line": "[1,2]", "error": "bad_request", "id": "null"},
    {"name": "data cut short", "line": '{"id":"q-9","func":"f","data":{"a":', "error": "bad_request", "id": '"q-9"'},
    {"name": "syntax error inside data", "line": '{"func":"f","id":12,"data":[1,}', "error": "bad_request", "id": "12"},
    {"name": "id after a syntax error", "line": '{"func":"f","data":[1,},"id":3}', "error": "bad_request", "id": "null"},
]
nd_resp = [
    {"name": "data", "id": "1", "data": '{"host":"1.2.3.4","port":8765}', "line": '{"id":1,"data":{"host":"1.2.3.4","port":8765}}\n'},
    {"name": "empty data is null", "id": '"a-1"', "data": "", "line": '{"id":"a-1","data":null}\n'},
    {"name": "error with code", "id": "7", "error": 'unknown method "x"', "code": "unimplemented", "line": '{"id":7,"error":"unknown method \\"x\\"","code":"unimplemented"}\n'},
]
with open(os.path.join(HERE, "ndjson.json"), "w") as f:
    json.dump({"requests": nd_valid, "invalid": nd_invalid, "responses": nd_resp}, f, indent=1)
    f.write("\n")

# refusal.json (spec 5.4): what a server sends in place of its hello when it
# refuses a connection, and what a client then reports.
REFUSAL_MSG = ("the server's peer policy refused this connection (uid 65534): permanent, "
               "retrying will not help; ask the server's operator to allow this user")
refusals = [
    {"name": "peer policy", "hex": frame(3, 0, REFUSAL_MSG.encode(), aux=7).hex(),
     "code": 7, "code_name": "permission_denied", "message": REFUSAL_MSG, "retryable": False},
    {"name": "unknown code is kept", "hex": frame(3, 0, b"go away", aux=99).hex(),
     "code": 99, "message": "go away", "retryable": False},
]
with open(os.path.join(HERE, "refusal.json"), "w") as f:
    json.dump({"refusals": refusals}, f, indent=1)
    f.write("\n")

# calls.json (spec 4.3): whole call sequences on one connection after the
# hellos. Each step is a frame from the client (a test sends it) or from the
# server (a test reads the next frame and compares it: type, flags, id, aux,
# head, payload; "head_any": the head is a message whose text is not fixed).
# The server is a demo/test server with the methods listed in "methods".

def step(frm, typ, id_, head=b"", payload=b"", flags=0, aux=0, note="", head_any=False, **extra):
    s = {"from": frm, "type": typ, "type_name": TYPES[typ], "flags": flags, "id": id_, "aux": aux,
         "head_hex": head.hex(), "payload_hex": payload.hex(), "hex": frame(typ, id_, head, payload, flags, aux).hex()}
    if head_any:
        s["head_any"] = True
    if note:
        s["note"] = note
    s.update(extra)
    return s


def C(typ, id_, head=b"", payload=b"", flags=0, aux=0, note=""):
    return step("client", typ, id_, head, payload, flags, aux, note)


def S(typ, id_, head=b"", payload=b"", flags=0, aux=0, note="", head_any=False, **extra):
    return step("server", typ, id_, head, payload, flags, aux, note, head_any, **extra)


REQ, RESP, ERR, CANCEL, SDATA, SEND, RDATA, REND = 1, 2, 3, 4, 5, 6, 11, 12
METHODS = {
    "sum": "bidi (JSON): each request item is a JSON number; after each item the server sends the running total as a JSON number; after request_end it sends stream_end",
    "echo": "unary: the response is the request payload",
    "hold": "bidi: reads no items and sends none; ends only when the call is canceled or the connection closes (a call that stays open after request_end)",
}
calls = [
    {"name": "bidi sum: an answer per item, then half-close ends the stream",
     "steps": [C(REQ, 5, req_head("sum"), flags=3), C(RDATA, 5, b"", b"1"), S(SDATA, 5, b"", b"1"),
               C(RDATA, 5, b"", b"2"), S(SDATA, 5, b"", b"3"), C(RDATA, 5, b"", b"4.5"), S(SDATA, 5, b"", b"7.5"),
               C(REND, 5), S(SEND, 5)]},
    {"name": "bidi sum: half-close with no items",
     "steps": [C(REQ, 7, req_head("sum"), flags=3), C(REND, 7), S(SEND, 7)]},
    {"name": "two bidi calls interleaved on one connection",
     "steps": [C(REQ, 1, req_head("sum"), flags=3), C(REQ, 2, req_head("sum"), flags=3),
               C(RDATA, 2, b"", b"10"), S(SDATA, 2, b"", b"10"), C(RDATA, 1, b"", b"1"), S(SDATA, 1, b"", b"1"),
               C(REND, 2), S(SEND, 2), C(RDATA, 1, b"", b"1"), S(SDATA, 1, b"", b"2"), C(REND, 1), S(SEND, 1)]},
    {"name": "a unary call between bidi items is unchanged",
     "steps": [C(REQ, 3, req_head("sum"), flags=3), C(REQ, 4, req_head("echo"), b"hi"), S(RESP, 4, b"", b"hi"),
               C(RDATA, 3, b"", b"2"), S(SDATA, 3, b"", b"2"), C(REND, 3), S(SEND, 3)]},
    {"name": "cancel ends the call; later items for its id are ignored",
     "steps": [C(REQ, 9, req_head("sum"), flags=3), C(RDATA, 9, b"", b"1"), S(SDATA, 9, b"", b"1"),
               C(CANCEL, 9, aux=1), C(RDATA, 9, b"", b"1", note="ignored: the call ended"), C(REND, 9, note="ignored"),
               C(REQ, 10, req_head("echo"), b"still open"), S(RESP, 10, b"", b"still open")]},
    {"name": "items for an id never opened are ignored (they race with a call's end)",
     "steps": [C(RDATA, 77, b"", b"1"), C(REND, 77), C(REQ, 1, req_head("echo"), b"ok"), S(RESP, 1, b"", b"ok")]},
    {"name": "an item that is not a number: the handler fails the call",
     "steps": [C(REQ, 11, req_head("sum"), flags=3), C(RDATA, 11, b"", b'"x"'),
               S(ERR, 11, aux=3, head_any=True, code_name="invalid_argument")]},
    {"name": "kind mismatch: a bidi method called as unary",
     "steps": [C(REQ, 12, req_head("sum"), b"1"), S(ERR, 12, aux=12, head_any=True, code_name="unimplemented")]},
    {"name": "kind mismatch: a bidi method called as a server stream",
     "steps": [C(REQ, 13, req_head("sum"), flags=1), S(ERR, 13, aux=12, head_any=True, code_name="unimplemented")]},
    {"name": "kind mismatch: a unary method called as bidi; its items are ignored",
     "steps": [C(REQ, 14, req_head("echo"), flags=3), C(RDATA, 14, b"", b"1"), C(REND, 14),
               S(ERR, 14, aux=12, head_any=True, code_name="unimplemented"),
               C(REQ, 15, req_head("echo"), b"ok"), S(RESP, 15, b"", b"ok")]},
    {"name": "violation: request data after request end",
     "steps": [C(REQ, 16, req_head("hold"), flags=3), C(REND, 16), C(RDATA, 16, b"", b"1"),
               S(ERR, 0, aux=32, head_any=True, code_name="protocol_violation", note="then the server closes")],
     "connection_error": True},
    {"name": "violation: a second request end",
     "steps": [C(REQ, 17, req_head("hold"), flags=3), C(REND, 17), C(REND, 17),
               S(ERR, 0, aux=32, head_any=True, code_name="protocol_violation", note="then the server closes")],
     "connection_error": True},
    {"name": "violation: a client-stream request with a payload",
     "steps": [C(REQ, 20, req_head("sum"), b"1", flags=3),
               S(ERR, 0, aux=32, head_any=True, code_name="protocol_violation", note="then the server closes")],
     "connection_error": True},
]
with open(os.path.join(HERE, "calls.json"), "w") as f:
    json.dump({"methods": METHODS, "calls": calls}, f, indent=1)
    f.write("\n")


# stats.json (spec 9.3): the udskit.stats request as bytes, the fields an
# answer carries, and answers with what a reader must take from them (a server
# without shared memory leaves "shm" out; unknown fields are ignored).
SHM_FIELDS = ["enabled", "threshold", "conns", "in_use", "capacity", "sent", "received", "waits", "over_half", "stalled",
              "slot_calls", "area_sent_bytes", "area_received_bytes", "spurious_wakes"]
# the call-slot counters (spec 9.3, 10.8), added after "stalled"
SLOT_FIELDS = ["slot_calls", "area_sent_bytes", "area_received_bytes", "spurious_wakes"]
stats_request = frame(REQ, 1, req_head("udskit.stats"), b"{}")
go_shm = {"enabled": True, "threshold": 16384, "conns": 2, "in_use": 1048576, "capacity": 67108864,
          "sent": 120, "received": 118, "waits": 0, "over_half": 0, "stalled": 0,
          "slot_calls": 0, "area_sent_bytes": 0, "area_received_bytes": 0, "spurious_wakes": 0}
# answers stalled behind the memory budget (spec 10.6): waits and stalled counted
stalled_shm = dict(go_shm, in_use=33554432, capacity=33554432, conns=1, waits=5, stalled=3)
# a Go server from before "stalled" (spec 9.3): it reads as 0
old_go_shm = {k: v for k, v in go_shm.items() if k != "stalled" and k not in SLOT_FIELDS}
# call slots (spec 10.8): 200 calls, 100 of them with 64 KiB each way in the
# payload areas (also counted in sent/received), two spurious wake-ups
slots_shm = dict(go_shm, conns=1, sent=220, received=218, slot_calls=200, area_sent_bytes=6553600,
                 area_received_bytes=6553600, spurious_wakes=2)
# a Go server from before the call-slot counters: they read as 0
pre_slots_shm = {k: v for k, v in slots_shm.items() if k not in SLOT_FIELDS}
no_shm = {k: (False if k == "enabled" else 0) for k in SHM_FIELDS}
stats_answers = [
    {"name": "a Go server with two regions", "payload": json.dumps({"conns": 3, "shm": go_shm}, separators=(",", ":")),
     "conns": 3, "shm": go_shm},
    {"name": "a server without shared memory (Node, Python): no shm, read as off", "payload": '{"conns":1}',
     "conns": 1, "shm": no_shm},
    {"name": "unknown fields are ignored", "payload": json.dumps({"conns": 2, "later": [1], "shm": dict(go_shm, future=7)}, separators=(",", ":")),
     "conns": 2, "shm": go_shm},
    {"name": "answers stalled behind the memory budget went on the socket", "payload": json.dumps({"conns": 1, "shm": stalled_shm}, separators=(",", ":")),
     "conns": 1, "shm": stalled_shm},
    {"name": "an older Go server without stalled: read as 0", "payload": json.dumps({"conns": 3, "shm": old_go_shm}, separators=(",", ":")),
     "conns": 3, "shm": go_shm},
    {"name": "call slots: slot calls, their payload-area bytes each way, spurious wake-ups", "payload": json.dumps({"conns": 1, "shm": slots_shm}, separators=(",", ":")),
     "conns": 1, "shm": slots_shm},
    {"name": "an older Go server without the call-slot counters: read as 0", "payload": json.dumps({"conns": 1, "shm": pre_slots_shm}, separators=(",", ":")),
     "conns": 1, "shm": dict(slots_shm, slot_calls=0, area_sent_bytes=0, area_received_bytes=0, spurious_wakes=0)},
]
with open(os.path.join(HERE, "stats.json"), "w") as f:
    json.dump({"method": "udskit.stats", "request_hex": stats_request.hex(), "request_id": 1,
               "shm_fields": SHM_FIELDS, "answers": stats_answers}, f, indent=1)
    f.write("\n")
