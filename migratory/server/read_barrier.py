"""A read barrier: wait until this process has applied everything committed before now.

A Guaranteed cluster member, or a worker of ``Workers = N``, reads its own copy of the
committed stream, and that copy can lag: a persistent MQTT session's record saved
through another worker or member a moment ago (its SUBACK sent there) may not be
applied here yet. An MQTT CONNECT that read it then found no session, or the record
before its last save (docs/mqtt.md, read barrier).

:class:`ReadBarrier` publishes a small barrier message -- not retained, on the reserved
subject :data:`BARRIER_SUBJECT`, which no client can subscribe to -- through the
member's own publish path: forwarded to the seed (or the Workers sequencer), numbered
after everything committed before it, acknowledged once *this* process applies the
batch that carries it. Then everything committed before the barrier was submitted is
applied here: a read made after it sees every save whose client had its answer before
the read began. One round trip, on the path publishes already take.

**Coalesced**: one barrier in flight at a time. A read that comes while one is in flight
joins the next, submitted as that one lands (the one in flight may have left before the
read came): 1,000 CONNECTs at once cost two barriers, not 1,000.

**Bounded**: a barrier fails as a publish fails (``ClusterPublishTimeout``, unknown
outcome: a partition); each reader also gives up after its own wait
(:data:`migratory.server.mqtt_input.READ_BARRIER_WAIT`). A single server (one process:
nothing committed elsewhere) has no barrier at all (``ServerContext.read_barrier`` is
None)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

from migratory.model.message import Message, Qos
from migratory.protocol import ops
from migratory.server.context import PublishPath

BARRIER_SUBJECT = "/$read-barrier/connect"
"""Where barriers are published (``/$``: reserved, refused to clients; two segments, as
every subject a seed or the sequencer takes from a link: one segment was refused,
PUBLISH_FAILED, and every CONNECT with it)."""
BARRIER_CONTENT = b"b"
"""Not empty: pickled for Raft (protocol 2), empty bytes name ``builtins.bytes``, which a
seed before cluster/raft_unpickler.py allowed it refused (every Raft tick failed)."""


class ReadBarrier:
    """Barriers through ``publishing``; ``clock``: the time a barrier is submitted at."""

    def __init__(self, publishing: PublishPath, clock: Callable[[], float]) -> None:
        self._publishing = publishing
        self._clock = clock
        self._in_flight: list[Future[bool]] | None = None  # the readers of the one in flight
        self._next: list[Future[bool]] = []  # readers that came after it left
        self.submitted = 0  # barriers submitted (/stats: mqtt read barriers)
        self.failed = 0  # barriers that failed (their readers refused)

    def join(self) -> Future[bool]:
        """A future that becomes True once everything committed before now is applied
        here (False: the barrier failed)."""
        reader: Future[bool] = Future()
        if self._in_flight is None:
            self._in_flight = [reader]
            self._submit()
        else:
            self._next.append(reader)
        return reader

    @property
    def waiting(self) -> int:
        """Readers waiting (in flight and next)."""
        return len(self._in_flight or ()) + len(self._next)

    def _submit(self) -> None:
        self.submitted += 1
        message = Message(BARRIER_SUBJECT, BARRIER_CONTENT, qos=Qos.GUARANTEED)
        self._publishing.submit(message, _Landed(self), self._clock())

    def _landed(self, ok: bool) -> None:
        readers, self._in_flight = self._in_flight or [], None
        if not ok:
            self.failed += 1
        for reader in readers:
            if not reader.done():
                reader.set_result(ok)
        if self._next:
            self._in_flight, self._next = self._next, []
            self._submit()


class _Landed:
    """The barrier's :class:`~migratory.server.context.PublishReply`."""

    __slots__ = ("_barrier",)

    def __init__(self, barrier: ReadBarrier) -> None:
        self._barrier = barrier

    def publish_result(self, status: ops.PublishStatus) -> None:
        self._barrier._landed(status.status is ops.Status.PUBLISH_OK)

    def publish_ok(self, closure: str | None, subject: str, epoch: int, seq: int) -> None:
        self._barrier._landed(True)

    def flush(self) -> None:
        pass
