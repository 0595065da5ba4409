"""The seeds' Raft, abstracted (test helper).

What Raft guarantees is taken as given; what the seeds do with it is the real code.
Each live seed holds the real replicated state (:class:`CoordinationConsumer`: the
coordinator and the replicated caches), applies every committed entry, and may dump
it (log compaction) the way pysyncobj does (``_serialize``, pickled); a seed restarts
from its dump (``_deserialize``, which hands the caches to the member) and replays
the entries after it.

Entries in flight carry what Raft told their submitter. The truth of each pysyncobj
failure reason, from its documentation: QUEUE_FULL, MISSING_LEADER, REQUEST_DENIED
(never appended) and DISCARDED (another entry took its index) never commit; for the
others (NOT_LEADER, LEADER_CHANGED, UNKNOWN_OUTCOME) the entry may still commit --
before the barrier its seed submits next, or never. Which of them the seeds treat as
definite is the product's business (``cluster.raft.DEFINITE_FAILURES``).

Not modelled: elections, terms, log divergence.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass

from pysyncobj import FAIL_REASON

from cluster.cache_sync import CacheSync
from cluster.coordination import CommittedBatch, PublishRequest
from cluster.raft import CoordinationConsumer, WireRequest, to_wire

NEVER_COMMITS = frozenset(
    {
        FAIL_REASON.QUEUE_FULL,
        FAIL_REASON.MISSING_LEADER,
        FAIL_REASON.REQUEST_DENIED,
        FAIL_REASON.DISCARDED,
    }
)
FAILURES = (
    FAIL_REASON.QUEUE_FULL,
    FAIL_REASON.MISSING_LEADER,
    FAIL_REASON.DISCARDED,
    FAIL_REASON.NOT_LEADER,
    FAIL_REASON.LEADER_CHANGED,
    FAIL_REASON.REQUEST_DENIED,
    FAIL_REASON.UNKNOWN_OUTCOME,
)

MakeConsumer = Callable[[Callable[[CommittedBatch], None], Callable[[CacheSync], None]],
                        CoordinationConsumer]


@dataclass
class InFlight:
    """A request submitted to Raft and not committed (yet)."""

    request: PublishRequest
    publisher: str | None
    via: str
    """The seed that submitted it."""
    reply_to: str | None
    """The non-seed that forwarded it to ``via`` (None: ``via``'s own client)."""
    in_doubt: bool = False
    """Raft told ``via`` it cannot say whether it commits."""
    overtaken: bool = False
    """Forwarded to a seed its non-seed has left since, it reaches that seed only now
    (a stalled link, a stopped seed): after what the non-seed forwarded next."""


@dataclass
class Barrier:
    """A seed waits for an empty entry to commit, then fails what is still pending."""

    via: str
    incarnation: int
    """``via``'s incarnation (a restarted seed has forgotten its barriers)."""
    origins: list[tuple[str, int]]
    error: str
    reply_to: str | None


class Consensus:
    def __init__(self, make_consumer: MakeConsumer) -> None:
        self.make_consumer = make_consumer
        self.consumers: dict[str, CoordinationConsumer] = {}
        self.dumps: dict[str, tuple[int, bytes]] = {}
        """Each seed's last dump (its log before it compacted away): (clsn, bytes)."""
        self.entries: list[tuple[int, list[WireRequest]]] = []
        """The committed Raft log: (epoch candidate, requests) of every batch."""
        self.in_flight: list[InFlight] = []
        self.barriers: list[Barrier] = []
        self._last: dict[str, CommittedBatch] = {}

    @property
    def quorum(self) -> bool:
        return len(self.consumers) >= 2

    def start(self, seed: str) -> CoordinationConsumer:
        consumer = self.make_consumer(self._on_commit(seed), lambda sync: None)
        self.consumers[seed] = consumer
        return consumer

    def _on_commit(self, seed: str) -> Callable[[CommittedBatch], None]:
        def take(batch: CommittedBatch) -> None:
            self._last[seed] = batch

        return take

    def stop(self, seed: str) -> None:
        del self.consumers[seed]
        self.barriers = [b for b in self.barriers if b.via != seed]
        for entry in self.in_flight:
            if entry.via == seed:
                entry.in_doubt = True  # nobody will be told; it may commit or not

    # --- committing -------------------------------------------------------------------

    def committable(self, take: Callable[[InFlight], bool]) -> list[InFlight]:
        """Entries in flight that ``take`` says yes to, in order; each publisher's are a
        prefix of its own (an entry not taken holds back the later ones), but for those
        overtaken (at the end: they hold back nothing)."""
        chosen: list[InFlight] = []
        blocked: set[str | None] = set()
        for entry in self.in_flight:
            if entry.publisher not in blocked and take(entry):
                chosen.append(entry)
            elif entry.publisher is not None and not entry.overtaken:
                blocked.add(entry.publisher)
        return chosen

    def commit(self, chosen: list[InFlight], epoch_candidate: int) -> CommittedBatch:
        """Raft commits a batch: every live seed applies it and numbers it, identically."""
        assert self.quorum, "a commit without a majority of the seeds"
        wire = to_wire([entry.request for entry in chosen])
        batches = {}
        for seed, consumer in self.consumers.items():
            consumer.commit_batch(epoch_candidate, wire, _doApply=True)
            batches[seed] = self._last.pop(seed)
        batch = next(iter(batches.values()))
        assert all(b == batch for b in batches.values()), "seeds numbered a batch differently"
        self.entries.append((epoch_candidate, wire))
        for entry in chosen:
            self.in_flight.remove(entry)
        return batch

    def discard_in_doubt(self) -> list[Barrier]:
        """A barrier committed: what was in doubt never commits; the barriers to settle."""
        self.in_flight = [entry for entry in self.in_flight if not entry.in_doubt]
        settled, self.barriers = self.barriers, []
        return settled

    # --- dumps ------------------------------------------------------------------------

    def dump(self, seed: str) -> None:
        """Log compaction: ``seed`` keeps its replicated state instead of its log."""
        consumer = self.consumers[seed]
        data = pickle.dumps(consumer._serialize())  # what pysyncobj writes
        self.dumps[seed] = (consumer.coordinator.clsn, data)

    def restore(self, seed: str, dump: tuple[int, bytes] | None) -> CacheSync | None:
        """``seed`` restarts: from ``dump`` (the sync it hands the member) and the log
        after it, or from the whole log."""
        restored: list[CacheSync] = []
        consumer = self.make_consumer(self._on_commit(seed), restored.append)
        start = 0
        if dump is not None:
            start, data = dump
            consumer._deserialize(pickle.loads(data))
            assert len(restored) == 1, "a dump was loaded without handing its caches over"
            # its numbering decodes in a thread of its own; the Raft thread would hold the
            # batches after it meanwhile (test_raft_numbering_decode.py): here, taken first
            consumer.coordinator.settle()
            consumer.catch_up()
        for epoch_candidate, wire in self.entries[start:]:
            consumer.commit_batch(epoch_candidate, wire, _doApply=True)
        self._last.pop(seed, None)
        for other in self.consumers.values():
            assert consumer.coordinator.to_state() == other.coordinator.to_state(), (
                "a restored seed numbers differently"
            )
        assert consumer.coordinator.clsn == len(self.entries)
        self.consumers[seed] = consumer
        return restored[0] if restored else None
