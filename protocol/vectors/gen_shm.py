#!/usr/bin/env python3
"""Regenerates vectors/shm.json (spec section 10, shared memory) with only the
Python standard library, independently of the Go code.
Run: python3 protocol/vectors/gen_shm.py"""
import json, os, struct

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def header(typ, flags, head_len, id_, payload_len, aux):
    return struct.pack("<BBHIII", typ, flags, head_len, id_, payload_len, aux)


def frame(typ, id_, head=b"", payload=b"", flags=0, aux=0):
    return header(typ, flags, len(head), id_, len(payload), aux) + head + payload


def hello(version, flags, max_frame, max_inflight):
    return b"UDSK" + struct.pack("<BBHII", version, flags, 0, max_frame, max_inflight)


def desc(off, n):
    return struct.pack("<II", off, n)


def req_head(method):
    m = method.encode()
    return struct.pack("<H", len(m)) + m


# --- negotiation: the shm feature is bit 2 (0x04); used when both hellos set it.
negotiate = [
    {"name": "both set shm (and stream credit)", "client": hello(1, 0x05, 16 * MiB, 0).hex(),
     "server": hello(1, 0x05, 16 * MiB, 4096).hex(), "features": 5, "shm": True},
    {"name": "server without shm: socket only", "client": hello(1, 0x05, 16 * MiB, 0).hex(),
     "server": hello(1, 0x01, 16 * MiB, 4096).hex(), "features": 1, "shm": False},
    {"name": "client without shm: socket only (a server never sets it alone)", "client": hello(1, 0x01, 16 * MiB, 0).hex(),
     "server": hello(1, 0x01, 16 * MiB, 4096).hex(), "features": 1, "shm": False},
    {"name": "with client_stream (0x02) too", "client": hello(1, 0x07, 16 * MiB, 0).hex(),
     "server": hello(1, 0x07, 16 * MiB, 4096).hex(), "features": 7, "shm": True},
]

# --- shm_offer (type 14): the frame's bytes; the fd and seal checks are tests, not vectors.
def offer(size, id_=0, head=b"", payload=None, flags=0, aux=0):
    p = struct.pack("<Q", size) if payload is None else payload
    return frame(14, id_, head, p, flags, aux)

offers_valid = [
    {"name": "64 MiB (Go's default)", "hex": offer(64 * MiB).hex(), "size": 64 * MiB},
    {"name": "smallest: 128 KiB", "hex": offer(128 << 10).hex(), "size": 128 << 10},
    {"name": "largest: 1 GiB", "hex": offer(1 << 30).hex(), "size": 1 << 30},
]
offers_invalid = [
    {"name": "size not a multiple of 65536", "hex": offer(64 * MiB + 4096).hex(), "error": "bad_offer"},
    {"name": "size under 128 KiB", "hex": offer(64 << 10).hex(), "error": "bad_offer"},
    {"name": "size over 1 GiB", "hex": offer((1 << 30) + (64 << 10)).hex(), "error": "bad_offer"},
    {"name": "size 0", "hex": offer(0).hex(), "error": "bad_offer"},
    {"name": "id not 0", "hex": offer(64 * MiB, id_=1).hex(), "error": "bad_offer"},
    {"name": "a head", "hex": offer(64 * MiB, head=b"\x01\x00x").hex(), "error": "bad_offer"},
    {"name": "payload of 4 bytes", "hex": offer(0, payload=b"\x00\x00\x00\x04").hex(), "error": "bad_offer"},
    {"name": "payload of 16 bytes", "hex": offer(0, payload=struct.pack("<QQ", 64 * MiB, 0)).hex(), "error": "bad_offer"},
    {"name": "not type 14 (a request first)", "hex": frame(1, 1, req_head("echo"), b"hi").hex(), "error": "bad_offer"},
]

# the server's answer (first frame after its hello): aux 1 accepted, 0 declined.
answers_valid = [
    {"name": "accepted", "hex": frame(14, 0, aux=1).hex(), "accepted": True},
    {"name": "declined (no descriptor arrived: a relay)", "hex": frame(14, 0, aux=0).hex(), "accepted": False},
]
answers_invalid = [
    {"name": "aux 2", "hex": frame(14, 0, aux=2).hex(), "error": "bad_offer"},
    {"name": "id not 0", "hex": frame(14, 3, aux=1).hex(), "error": "bad_offer"},
    {"name": "a payload", "hex": frame(14, 0, payload=b"\x01", aux=1).hex(), "error": "bad_offer"},
    {"name": "a response first", "hex": frame(2, 1, payload=b"x").hex(), "error": "bad_offer"},
]

# --- descriptors (flag 0x04 on request / response / stream_data), checked
# against a region of region_size bytes and the negotiated max_frame.
S = 1 * MiB
HALF = S // 2
MAXF = 256 << 10
descs = []

def dv(name, typ, id_, off, n, sender, outstanding=(), flags=0x04, head=b"", aux=0):
    descs.append({"name": name, "hex": frame(typ, id_, head, desc(off, n), flags, aux).hex(),
                  "sender": sender, "outstanding": [list(o) for o in outstanding],
                  "ok": True, "offset": off, "length": n})

def di(name, data_hex, sender, outstanding=(), error="bad_desc"):
    descs.append({"name": name, "hex": data_hex, "sender": sender,
                  "outstanding": [list(o) for o in outstanding], "ok": False, "error": error})

dv("request in the client half", 1, 1, 0, 64 << 10, "client", head=req_head("echo"))
dv("request ending exactly at the half", 1, 2, HALF - 4096, 4096, "client", head=req_head("echo"), aux=250000)
dv("stream request (flags stream|shm = 0x05)", 1, 3, 8192, 100, "client", flags=0x05, head=req_head("count"))
dv("response in the server half", 2, 1, HALF, 64 << 10, "server")
dv("stream_data at the end of the region", 5, 9, S - 1, 1, "server")
dv("unaligned offset is accepted", 2, 4, HALF + 3, 1000, "server")
dv("adjacent to an outstanding slot", 2, 5, HALF + 4096, 4096, "server", outstanding=[(HALF, 4096)])
dv("length equal to max frame", 1, 6, 0, MAXF, "client", head=req_head("echo"))
di("payload of 7 bytes", frame(2, 1, b"", desc(HALF, 10)[:7], 0x04).hex(), "server")
di("payload of 9 bytes", frame(2, 1, b"", desc(HALF, 10) + b"\x00", 0x04).hex(), "server")
di("length 0", frame(2, 1, b"", desc(HALF, 0), 0x04).hex(), "server")
di("length over max frame", frame(1, 1, req_head("echo"), desc(0, MAXF + 1), 0x04).hex(), "client")
di("response slot in the client half", frame(2, 1, b"", desc(0, 100), 0x04).hex(), "server")
di("request slot in the server half", frame(1, 1, req_head("echo"), desc(HALF, 100), 0x04).hex(), "client")
di("request slot crossing the half", frame(1, 1, req_head("echo"), desc(HALF - 100, 200), 0x04).hex(), "client")
di("past the end of the region", frame(2, 1, b"", desc(S - 10, 11), 0x04).hex(), "server")
di("offset past the region", frame(2, 1, b"", desc(S, 1), 0x04).hex(), "server")
di("offset + length wraps 32 bits", frame(2, 1, b"", desc(0xFFFFFF00, 0x200), 0x04).hex(), "server")
di("overlaps an outstanding slot", frame(2, 2, b"", desc(HALF + 100, 4096), 0x04).hex(), "server",
   outstanding=[(HALF, 4096)])
di("same slot twice before its release", frame(1, 2, req_head("echo"), desc(0, 4096), 0x04).hex(), "client",
   outstanding=[(0, 4096)])
di("inside an outstanding slot", frame(1, 3, req_head("echo"), desc(100, 10), 0x04).hex(), "client",
   outstanding=[(0, 4096)])

# --- shm_release (type 15): checked by the writer against the slots it handed over.
rel = []
def rel_frame(entries, id_=0, head=b""):
    return frame(15, id_, head, b"".join(desc(o, n) for o, n in entries))

rel.append({"name": "one slot", "hex": rel_frame([(0, 4096)]).hex(), "handed_over": [[0, 4096]],
            "ok": True, "released": [[0, 4096]]})
rel.append({"name": "a batch of three, any order", "hex": rel_frame([(8192, 10), (0, 4096), (4096, 4096)]).hex(),
            "handed_over": [[0, 4096], [4096, 4096], [8192, 10], [65536, 1]], "ok": True,
            "released": [[8192, 10], [0, 4096], [4096, 4096]]})
rel.append({"name": "server half slot", "hex": rel_frame([(HALF, 65536)]).hex(), "handed_over": [[HALF, 65536]],
            "ok": True, "released": [[HALF, 65536]]})
for name, data, handed in [
    ("unknown slot", rel_frame([(4096, 4096)]), [[0, 4096]]),
    ("length differs", rel_frame([(0, 100)]), [[0, 4096]]),
    ("released twice in one frame", rel_frame([(0, 4096), (0, 4096)]), [[0, 4096]]),
    ("no entries", rel_frame([]), [[0, 4096]]),
    ("payload not a multiple of 8", frame(15, 0, b"", desc(0, 4096) + b"\x00"), [[0, 4096]]),
    ("id not 0", rel_frame([(0, 4096)], id_=5), [[0, 4096]]),
    ("a head", rel_frame([(0, 4096)], head=b"x"), [[0, 4096]]),
    ("2049 entries", rel_frame([(i * 64, 64) for i in range(2049)]), [[i * 64, 64] for i in range(2049)]),
]:
    rel.append({"name": name, "hex": data.hex(), "handed_over": handed, "ok": False, "error": "bad_release"})


# --- call slots (section 10.8, hello flag bit 3 shm_calls, only with bit 2).
# In use when both hellos set bits 2 and 3 (and the offer was accepted).
def slot_id(k, seq):
    return 0x80000000 | k << 24 | (seq & 0xFFFFFF)  # Go's choice; any id not in flight is valid

calls_negotiate = [
    {"name": "both set shm and shm_calls", "client": hello(1, 0x0F, 16 * MiB, 0).hex(),
     "server": hello(1, 0x0F, 16 * MiB, 4096).hex(), "calls": True},
    {"name": "an old client (no bit 3) against a server that sets it: section 10 only",
     "client": hello(1, 0x07, 16 * MiB, 0).hex(), "server": hello(1, 0x0F, 16 * MiB, 4096).hex(), "calls": False},
    {"name": "an old server (no bit 3): section 10 only", "client": hello(1, 0x0F, 16 * MiB, 0).hex(),
     "server": hello(1, 0x07, 16 * MiB, 4096).hex(), "calls": False},
    {"name": "bit 3 without bit 2 means nothing", "client": hello(1, 0x0B, 16 * MiB, 0).hex(),
     "server": hello(1, 0x0B, 16 * MiB, 4096).hex(), "calls": False},
]
# The client's bell (10.8, hello flag bit 4 shm_calls_bell, only with bits 2
# and 3): in use when call slots are and both hellos set bit 4.
for n in calls_negotiate:
    n["bell"] = False
calls_negotiate += [
    {"name": "both set shm, shm_calls and shm_calls_bell", "client": hello(1, 0x1F, 16 * MiB, 0).hex(),
     "server": hello(1, 0x1F, 16 * MiB, 4096).hex(), "calls": True, "bell": True},
    {"name": "a server without bit 4: call slots, per-slot wakes", "client": hello(1, 0x1F, 16 * MiB, 0).hex(),
     "server": hello(1, 0x0F, 16 * MiB, 4096).hex(), "calls": True, "bell": False},
    {"name": "a client without bit 4: call slots, per-slot wakes", "client": hello(1, 0x0F, 16 * MiB, 0).hex(),
     "server": hello(1, 0x1F, 16 * MiB, 4096).hex(), "calls": True, "bell": False},
    {"name": "bit 4 without bit 3 means nothing", "client": hello(1, 0x17, 16 * MiB, 0).hex(),
     "server": hello(1, 0x17, 16 * MiB, 4096).hex(), "calls": False, "bell": False},
]
AREA = 1536
BLOCK = 65536
PAREA = 64 << 10  # slot k's payload area: PAREA bytes at BLOCK + PAREA*k of each half
RESERVED = BLOCK + 32 * PAREA  # payload slots (10.4) start here in each half
slot_frames = []
def sv(name, data, n=None, ok=True, error=None, max_frame=16 * MiB):
    e = {"name": name, "hex": data.hex(), "len": len(data) if n is None else n, "max_frame": max_frame, "ok": ok}
    if error:
        e["error"] = error
    slot_frames.append(e)
sv("a 64-byte echo request, inline", frame(1, slot_id(0, 1), req_head("echo"), bytes(range(64))))
sv("a 64 KiB echo request in slot 3, its payload in slot 3's payload area (no release)",
   frame(1, slot_id(3, 7), req_head("echo"), desc(BLOCK + 3 * PAREA, 65536), 0x04, aux=250000))
sv("a 1 MiB echo request, its payload in a payload slot after the areas (released as in 10.5)",
   frame(1, slot_id(3, 8), req_head("echo"), desc(RESERVED, 1 << 20), 0x04))
sv("an empty request", frame(1, slot_id(31, 1), req_head("ping")))
sv("the largest frame that fits the area", frame(1, slot_id(1, 1), req_head("echo"), b"x" * (AREA - 16 - 6)))
sv("length word over the area", frame(1, slot_id(0, 1), req_head("echo"), b"hi"), n=AREA + 1, ok=False, error="bad_call")
sv("length word under a header", frame(1, slot_id(0, 1), req_head("echo"), b"hi")[:15], ok=False, error="bad_call")
sv("lengths that do not add up to the length word", frame(1, slot_id(0, 1), req_head("echo"), b"hi") + b"\0", ok=False, error="bad_call")
sv("a stream request (only unary requests go in slots)", frame(1, slot_id(0, 1), req_head("count"), b"", 0x01), ok=False, error="bad_call")
sv("a cancel frame", frame(4, slot_id(0, 1)), ok=False, error="bad_call")
sv("a descriptor of 7 bytes", frame(1, slot_id(0, 1), req_head("echo"), desc(65536, 10)[:7], 0x04), ok=False, error="bad_desc")
sv("payload over the max frame", frame(1, slot_id(0, 1), req_head("echo"), b"x" * 100), ok=False, error="frame_too_large", max_frame=64)
# Descriptors in call slot k's frame (10.8 "Payload areas"): one that
# starts at slot k's area of the sender's half is an area payload (length
# 1..PAREA, else bad_call), never released; any other is an ordinary
# payload slot, checked as in 10.4 with the half starting at RESERVED, so one
# into any area (another slot's, or the peer's) fails there (bad_desc).
CS = 16 * MiB
area_descs = []
def ad(name, sender, k, off, ln, area, ok=True, error=None):
    e = {"name": name, "sender": sender, "k": k, "hex": desc(off, ln).hex(), "area": area, "ok": ok}
    if error:
        e["error"] = error
    area_descs.append(e)
ad("client slot 0, its whole area", "client", 0, BLOCK, PAREA, True)
ad("client slot 31, one byte", "client", 31, BLOCK + 31 * PAREA, 1, True)
ad("server slot 5, 64 KiB", "server", 5, CS // 2 + BLOCK + 5 * PAREA, PAREA, True)
ad("client slot 2, one byte over its area", "client", 2, BLOCK + 2 * PAREA, PAREA + 1, True, False, "bad_call")
ad("client slot 2, length 0", "client", 2, BLOCK + 2 * PAREA, 0, True, False, "bad_call")
ad("server slot 0, over the area", "server", 0, CS // 2 + BLOCK, 1 << 20, True, False, "bad_call")
ad("client slot 2 naming slot 3's area", "client", 2, BLOCK + 3 * PAREA, 100, False, False, "bad_desc")
ad("client slot 2, inside its own area but not at its start", "client", 2, BLOCK + 2 * PAREA + 64, 100, False, False, "bad_desc")
ad("server slot 0 naming the client's slot 0 area", "server", 0, BLOCK, 100, False, False, "bad_desc")
ad("client slot 0, a payload slot after the areas", "client", 0, RESERVED, 1 << 20, False)
ad("server slot 9, a payload slot after the areas", "server", 9, CS // 2 + RESERVED, 128 << 10, False)
calls = {
    "feature_flag": 8,
    "control_block": 65536,
    "slots": 32,
    "line0": 1024,
    "line": 128,
    "area0": 16384,
    "area_size": AREA,
    "off_bell": 0,
    "off_server_sleeping": 64,
    "off_seq": 0,
    "off_len": 4,
    "off_sleeping": 8,
    "bell_feature_flag": 0x10,
    "off_cbell": 128,  # server half: the server adds 1 per answer (bit 4)
    "off_csleeping": 128,  # client half: 1 while the client's poller sleeps on cbell (bit 4)
    "max_nap_ms": 10,
    "payload_area0": BLOCK,
    "payload_area_size": PAREA,
    "reserved": RESERVED,
    "area_region_size": CS,
    "area_descs": area_descs,
    "negotiate": calls_negotiate,
    "slot_frames": slot_frames,
}

out = {
    "feature_flag": 4,
    "desc_flag": 4,
    "type_shm_offer": 14,
    "type_shm_release": 15,
    "min_region": 128 << 10,
    "max_region": 1 << 30,
    "region_multiple": 65536,
    "seals": {"F_SEAL_SEAL": 1, "F_SEAL_SHRINK": 2, "F_SEAL_GROW": 4, "required": 7},
    "negotiate": negotiate,
    "offers": {"valid": offers_valid, "invalid": offers_invalid},
    "answers": {"valid": answers_valid, "invalid": answers_invalid},
    "descriptors": {"region_size": S, "max_frame": MAXF, "entries": descs},
    "releases": rel,
    "calls": calls,
}
with open(os.path.join(HERE, "shm.json"), "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
