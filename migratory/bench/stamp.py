"""The fan-out benchmark's content stamp: ``@@TS`` + 19 digits of ``monotonic_ns``, and its scanner.

The publisher puts a stamp at the start of each content; the subscribers find
every stamp in a received chunk with one compiled-regex scan, whatever the
frame boundaries. ``self_test`` checks the scanner offline (``--self-test``).
"""

from __future__ import annotations

import random
import re

import cbor2

from migratory.bench.wsraw import RECV_SIZE
from migratory.protocol.websocket import encode_binary

SUBJECT = "/bench/fanout"


def subject_for(index: int, subjects: int) -> str:
    """Subscriber ``index``'s subject, and message ``index``'s (round-robin over them)."""
    return SUBJECT if subjects == 1 else f"{SUBJECT}/{index % subjects}"


def expected_for(index: int, subjects: int, sent: int) -> int:
    """How many of ``sent`` round-robin messages subscriber ``index`` should receive."""
    return sent // subjects + (1 if index % subjects < sent % subjects else 0)

MARK = b"@@TS"
STAMP_END = len(MARK) + 19  # the stamp's digits end this far after the marker
STAMP = re.compile(re.escape(MARK) + rb"(\d{19})")


def scan_stamps(data: bytes) -> tuple[list[bytes], bytes]:
    """The stamps (19 digits each) in ``data``, and the bytes to carry into the next chunk.

    Frame boundaries do not matter, only the marker does. A stamp cut by the
    end of the chunk starts with ``@`` within its last ``STAMP_END - 1`` bytes;
    everything from the first ``@`` there on is carried over. A carry is
    shorter than a stamp, so no stamp is ever counted twice.
    """
    i = data.find(b"@", -(STAMP_END - 1))  # a negative start is clamped to 0 on short data
    return STAMP.findall(data), (data[i:] if i >= 0 else b"")


def self_test(rounds: int = 200) -> None:
    """Split a stream of server frames at random points; every stamp must be found once."""
    rng = random.Random(1)
    for _ in range(rounds):
        count = rng.randint(1, 2000)
        stream = b"".join(
            encode_binary(
                cbor2.dumps(
                    {
                        "op": "message",
                        "subject": SUBJECT,
                        "content": MARK + b"%019d" % (10**18 + i) + b"@" * 77,
                        "epoch": rng.getrandbits(47),
                        "seq": i,
                    }
                )
            )
            for i in range(count)
        )
        found: list[int] = []
        pos = 0
        carry = b""
        while pos < len(stream):
            step = rng.choice((1, 2, 5, 22, 23, 24, 100, RECV_SIZE, rng.randint(1, 5000)))
            stamps, carry = scan_stamps(carry + stream[pos : pos + step])
            found += (int(s) for s in stamps)
            pos += step
        assert found == [10**18 + i for i in range(count)], "stamp scanner lost or doubled one"
    print(f"self-test: stamp scanner OK over {rounds} randomly split streams")
