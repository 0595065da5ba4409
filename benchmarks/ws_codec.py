"""Micro-benchmark of the WebSocket codec's hot paths.

    .venv/bin/python benchmarks/ws_codec.py [payload sizes...]

Prints nanoseconds per ``encode_binary`` (the server frame every subscriber
gets) and per decode of one masked client frame (``receive_data`` +
``next_event``), best of several timeit runs. Default size: 150 bytes.
"""

from __future__ import annotations

import os
import sys
import timeit
from collections.abc import Callable

from migratory.protocol.websocket import (
    BinaryMessage,
    FrameDecoder,
    encode_binary,
    encode_masked_binary,
)


def best_ns(func: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(func, number=number, repeat=7)) / number * 1e9


def measure(size: int) -> tuple[float, float]:
    """(ns per encode_binary, ns per masked-frame decode) for a ``size``-byte payload."""
    payload = os.urandom(size)
    frame = encode_masked_binary(payload, os.urandom(4))
    decoder = FrameDecoder(max_message_size=max(size, 1 << 20))
    receive, next_event = decoder.receive_data, decoder.next_event

    def decode() -> object:
        receive(frame)
        return next_event()

    assert decode() == BinaryMessage(payload)
    number = max(200, 2_000_000 // max(size, 100))
    return best_ns(lambda: encode_binary(payload), number * 10), best_ns(decode, number)


def main(sizes: list[int]) -> None:
    for size in sizes:
        encode_ns, decode_ns = measure(size)
        print(
            f"{size:>7} B payload: encode_binary {encode_ns:8.0f} ns/op"
            f"   decode masked frame {decode_ns:8.0f} ns/op"
        )


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]] or [150])
