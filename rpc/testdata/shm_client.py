#!/usr/bin/env python3
"""An independent shared-memory client written from protocol/spec.md section 10
alone (standard library only), used by rpc's TestShmPythonClient against the Go
server. Usage: shm_client.py SOCKET_PATH. Prints one line per check; exits 1 on
the first failure."""
import mmap, os, socket, struct, sys

HDR = struct.Struct("<BBHIII")
path = sys.argv[1]
S = 1 << 20  # 1 MiB region: client half [0, S/2), server half [S/2, S)

def fail(msg):
    print("FAIL", msg)
    sys.exit(1)

def recv_exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            fail("connection closed")
        b += c
    return b

def read_frame(s):
    t, fl, hl, id_, pl, aux = HDR.unpack(recv_exact(s, 16))
    head = recv_exact(s, hl) if hl else b""
    payload = recv_exact(s, pl) if pl else b""
    return t, fl, id_, aux, head, payload

fd = os.memfd_create("pyshm", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
os.ftruncate(fd, S)
import fcntl
fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
region = mmap.mmap(fd, S, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
s.sendall(b"UDSK" + struct.pack("<BBHII", 1, 0x05, 0, 16 << 20, 0))
hello = recv_exact(s, 16)
if hello[:4] != b"UDSK" or not hello[5] & 0x04:
    fail("server hello without the shm flag: %r" % hello)
offer = HDR.pack(14, 0, 0, 0, 8, 0) + struct.pack("<Q", S)
socket.send_fds(s, [offer], [fd])
os.close(fd)
t, fl, id_, aux, head, payload = read_frame(s)
if (t, id_, aux, head, payload) != (14, 0, 1, b"", b""):
    fail("answer %r" % ((t, id_, aux, head, payload),))
print("ok accepted")

def req_head(method):
    m = method.encode()
    return struct.pack("<H", len(m)) + m

held = {}  # our request slots the server has not released: offset -> length
for i, n in enumerate([100 << 10, 20 << 10, 300 << 10]):
    off = 4096 * (1 + i * 10)
    body = bytes((j * 13 + i) & 0xFF for j in range(n))
    region[off:off + n] = body
    head = req_head("echo")
    s.sendall(HDR.pack(1, 0x04, len(head), i + 1, 8, 0) + head + struct.pack("<II", off, n))
    held[off] = n
    got = None
    while got is None or held:
        t, fl, id_, aux, head, payload = read_frame(s)
        if t == 15:
            if id_ != 0 or len(payload) % 8 or not payload:
                fail("bad release frame")
            for k in range(0, len(payload), 8):
                o, l = struct.unpack_from("<II", payload, k)
                if held.pop(o, None) != l:
                    fail("release of a slot not handed over: %d %d" % (o, l))
        elif t == 2 and id_ == i + 1:
            if not fl & 0x04 or len(payload) != 8:
                fail("response of %d bytes not in the region" % n)
            o, l = struct.unpack("<II", payload)
            if not (S // 2 <= o and o + l <= S and l == n):
                fail("response slot out of the server half: %d %d" % (o, l))
            got = bytes(region[o:o + l])
            s.sendall(HDR.pack(15, 0, 0, 0, 8, 0) + struct.pack("<II", o, l))
        else:
            fail("unexpected frame type %d" % t)
    if got != body:
        fail("echo of %d bytes differs" % n)
    print("ok echo", n)

# a small call stays on the socket
head = req_head("echo")
s.sendall(HDR.pack(1, 0, len(head), 9, 5, 0) + head + b"small")
t, fl, id_, aux, head, payload = read_frame(s)
if (t, fl & 0x04, payload) != (2, 0, b"small"):
    fail("small echo %r" % ((t, fl, payload),))
print("ok small")
# a descriptor past the region: the server ends the connection with protocol_violation (32)
rh = req_head("echo")
s.sendall(HDR.pack(1, 0x04, len(rh), 10, 8, 0) + rh + struct.pack("<II", S, 1))
t, fl, id_, aux, head, payload = read_frame(s)
if (t, id_, aux) != (3, 0, 32) or b"outside the sender's half" not in head:
    fail("bad descriptor answered with %r" % ((t, id_, aux, head),))
print("ok violation", head.decode())
