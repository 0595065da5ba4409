"""A Raft dump's cached messages (and its numbering), decoded off the Raft thread.

pysyncobj loads a dump on its Raft thread: a seed's own at start-up, the leader's when
it is sent one. Unpickled whole, the default ``CacheMemoryBudget``'s ~660,000 cached
messages were ~0.5 s of that thread's CPU (twice at start-up: once to see where the dump
ends), and 1-3 s of wall clock on a busy box; meanwhile the seed answered no
AppendEntries and no vote, and a follower that had taken the leader's dump stood for
election at its next tick, its deadline long past (docs/benchmarks.md, "A seed's Raft
thread restarting from a dump"). So a seed writes its caches into the dump as one
``bytes`` (:func:`encode`: pickled, then compressed; the Raft thread unpickles it as a
single object and checks its CRC-32), and :class:`DumpDecoding` turns it back into
caches in a thread of its own while the Raft thread goes on
(:class:`~cluster.replicated_cache.ReplicatedCache` queues what it is given meanwhile
and applies it, in commit order, to the decoded caches).

The decoding thread shares the GIL with the Raft thread and the event loop. It reads
the pickle through :class:`_Frames`, a reader written in Python: the C unpickler calls
it once per 64 KiB frame, and a call into Python code is where a thread waiting for the
GIL gets it (the switch interval, 0.5 ms in a member): unpickled from an in-memory
``bytes``, the whole pickle was one call that held the GIL for ~0.4 s.

Pure apart from its one thread: no trio, no pysyncobj, no sockets.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import threading
import zlib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from cluster import raft_unpickler

__all__ = [
    "CACHES_PROTOCOL", "COMPRESS_LEVEL", "DumpDecodeError", "DumpDecoding", "encode",
    "stop_reason",
]

log = logging.getLogger("migratory.raft")

T = TypeVar("T")

CACHES_PROTOCOL = 4
"""The pickle protocol of the caches' bytes (as ``raft_dump_files.DUMP_PROTOCOL``: a
``bytes`` written as bytes, and framed, which :class:`_Frames` relies on)."""
COMPRESS_LEVEL = 6
"""zlib's level for the caches' bytes (the dump's gzip then finds little to do in them)."""


class DumpDecodeError(ValueError):
    """A dump's caches do not decode: their CRC-32 does not match, or the bytes do not
    unpickle. A ``ValueError``: a sync that cannot be installed (cluster/cache_sync.py)."""


def stop_reason(exc: DumpDecodeError, dump_file: str | None) -> str:
    """Why a seed whose loaded dump did not decode stops (logged): its CRC-32 matched, so
    a bug or the memory; its replicated caches are not the other seeds'."""
    reason = f"{exc} (the Raft dump {dump_file or '(in memory)'})"
    log.critical(
        "Raft: %s: this seed stops taking part in Raft (its replicated caches are not the "
        "other seeds'). To do: report it; empty this seed's ClusterDataDir and start it "
        "again (it takes the leader's dump)", reason, exc_info=exc,
    )
    return reason


def encode(state: Any) -> tuple[bytes, int]:
    """``state`` pickled and compressed, and its CRC-32 (in the dump writer's child)."""
    packed = zlib.compress(pickle.dumps(state, CACHES_PROTOCOL), COMPRESS_LEVEL)
    return packed, zlib.crc32(packed)


class _Frames:
    """A file over ``data`` whose reads are Python calls (see the module docstring)."""

    __slots__ = ("_stream",)

    def __init__(self, data: bytes) -> None:
        self._stream = io.BytesIO(data)

    def read(self, size: int = -1) -> bytes:
        return self._stream.read(size)

    def readinto(self, buffer: Any) -> int:
        return self._stream.readinto(buffer)

    def readline(self) -> bytes:
        return self._stream.readline()


def decode(packed: bytes, what: str = "cached messages") -> Any:
    """The state :func:`encode` packed (only the types ``raft_unpickler`` allows)."""
    try:
        return raft_unpickler.RaftUnpickler(_Frames(zlib.decompress(packed))).load()
    except (zlib.error, pickle.UnpicklingError, EOFError, ValueError, TypeError,
            AttributeError, KeyError, IndexError) as exc:
        raise DumpDecodeError(
            f"the Raft dump's {what} do not decode ({type(exc).__name__}: {exc})"
        ) from exc


class DumpDecoding(Generic[T]):
    """One dump's caches: ``build`` of what they decode to, made in a thread of its own
    (:meth:`begin`) or, if none was begun, by the first :meth:`result` in its caller's.

    ``build`` gets the decoded state and ``handed`` (set before the decoding begins)
    and runs in that thread too. Nothing is shared with the thread but ``packed`` and
    ``handed`` (immutable); the result is read only once :meth:`done`."""

    __slots__ = ("_build", "_done", "_error", "_packed", "_pid", "_result", "_thread",
                 "handed", "what")

    def __init__(self, packed: bytes, crc: int, build: Callable[[Any, Any], T],
                 what: str = "cached messages") -> None:
        if zlib.crc32(packed) != crc:
            raise DumpDecodeError(
                f"the Raft dump's {what} are damaged: CRC-32 {zlib.crc32(packed):#010x}"
                f", written {crc:#010x} ({len(packed)} bytes)"
            )
        self.what = what
        self._packed = packed
        self._build = build
        self.handed: Any = ()
        self._result: T | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    @property
    def begun(self) -> bool:
        return self._thread is not None

    def begin(self) -> None:
        """Decode in a thread of its own from now on (once)."""
        if self._thread is None and not self._done.is_set():
            self._thread = threading.Thread(
                target=self._run, name="raft-dump-decoder", daemon=True
            )
            self._thread.start()

    def done(self) -> bool:
        """Whether :meth:`result` answers at once."""
        return self._done.is_set()

    def result(self) -> T:
        """What ``build`` made: waited for if a thread makes it; made here if none does
        (none was begun, or this is a forked child -- a dump writer -- where the thread
        of its parent does not run). :class:`DumpDecodeError` if it failed."""
        if not self._done.is_set():
            if self._thread is not None and os.getpid() == self._pid:
                self._done.wait()
            elif self._result is None and self._error is None:  # (or its thread was done)
                self._run()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def _run(self) -> None:
        try:
            self._result = self._build(decode(self._packed, self.what), self.handed)
        except DumpDecodeError as exc:
            self._error = exc
        except BaseException as exc:  # (any: handed to whoever reads the result)
            self._error = DumpDecodeError(f"the Raft dump's {self.what} could not be "
                                          f"decoded ({type(exc).__name__}: {exc})")
            self._error.__cause__ = exc
        self._packed, self._build = b"", _built  # (the bytes freed at once)
        self._done.set()


def _built(state: Any, handed: Any) -> Any:
    raise AssertionError("a dump's caches are decoded once")
