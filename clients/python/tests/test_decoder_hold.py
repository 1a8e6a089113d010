"""FrameDecoder under random splits and holds (the server's ITER_CALLS / ITER_FRAMES /
budget holds): every frame comes out once, in order, whole, and ``buffered`` always
counts exactly the bytes fed and not yet given out."""

from __future__ import annotations

import random

from udskit._wire import HEADER, FrameDecoder


def frame(i: int, pl: int) -> bytes:
    body = bytes([i % 251]) * pl
    head = b"m" * (i % 5)
    return HEADER.pack(1, 0, len(head), i, len(body), 0) + head + body


def test_random_splits_and_holds_keep_every_frame_and_count_every_byte() -> None:
    for seed in range(300):
        rnd = random.Random(seed)
        frames = [frame(i + 1, rnd.choice([0, 1, 5, 40, 300, 5000, 70000])) for i in range(rnd.randint(1, 120))]
        stream = b"".join(frames)
        got: list[bytes] = []

        def on_frame(t: int, flags: int, id: int, aux: int, head: bytes, payload: bytes) -> None:
            assert type(head) is bytes and type(payload) is bytes
            got.append(HEADER.pack(t, flags, len(head), id, len(payload), aux) + head + payload)
            if rnd.random() < 0.3:
                d.hold = True

        d = FrameDecoder(on_frame)
        pos = 0
        for _ in range(100_000):  # (bounded: a decoder keeping bytes forever fails, not hangs)
            if pos < len(stream) and rnd.random() < 0.7:
                k = rnd.randint(1, 9000)
                d.feed(stream[pos : pos + k])
                pos = min(pos + k, len(stream))
            else:
                d.hold = False
                d.feed(b"")
            assert d.buffered == pos - sum(map(len, got)), seed
            if pos == len(stream) and not d.hold and not d.buffered:
                break
        else:
            raise AssertionError(f"seed {seed}: {d.buffered} bytes never given out")
        assert got == frames, seed
