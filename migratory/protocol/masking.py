"""WebSocket masking (RFC 6455 section 5.3): XOR with a repeated 4-byte key, sans-I/O.
Masking and unmasking are the same operation."""

from __future__ import annotations

# Below this size one big-int XOR wins; above it, four strided byte translations
# do (CPython 3.11, payload in a bytearray: equal near 400 B, translate 1.4x faster
# at 1 KiB and 2x faster at 64 KiB).
_TRANSLATE_THRESHOLD = 512
_IDENTITY = int.from_bytes(bytes(range(256)), "big")
_XOR_TABLES: tuple[bytes, ...] = tuple(
    (_IDENTITY ^ int.from_bytes(bytes((m,)) * 256, "big")).to_bytes(256, "big") for m in range(256)
)


def apply_mask(data: bytes | bytearray, start: int, end: int, mask: bytes | bytearray) -> bytes:
    """XOR ``data[start:end]`` with the repeated 4-byte ``mask`` (masking == unmasking)."""
    n = end - start
    if n < _TRANSLATE_THRESHOLD:
        key = (mask * ((n >> 2) + 1))[:n]
        return (int.from_bytes(data[start:end], "big") ^ int.from_bytes(key, "big")).to_bytes(
            n, "big"
        )
    out = bytearray(n)
    tables = _XOR_TABLES
    out[0::4] = data[start:end:4].translate(tables[mask[0]])
    out[1::4] = data[start + 1 : end : 4].translate(tables[mask[1]])
    out[2::4] = data[start + 2 : end : 4].translate(tables[mask[2]])
    out[3::4] = data[start + 3 : end : 4].translate(tables[mask[3]])
    return bytes(out)
