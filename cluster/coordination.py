"""The seed members' replicated state: numbering publications with positions.

Pure and deterministic. Every publish taken by any member becomes a
:class:`PublishRequest`; the seeds agree (Raft) on batches of requests, and when a
batch is committed EVERY seed applies it to its :class:`Coordinator` in the same
order. The coordinator gives each message its subject group's epoch and the next seq
of its subject, so every seed numbers every message the same way and positions
survive a change of Raft leader by construction.

Each member's publishes are numbered in the order it took them (its ``ref`` order):
a request older than one already numbered from its origin is dropped, never numbered
(:meth:`Coordinator.in_origin_order`). A non-seed forwards its publishes to one seed at a
time, but what it forwarded to a seed it then left -- a stalled link, a stopped seed --
can still reach that seed, and be submitted, after the publishes it forwarded through
the next seed were numbered: numbered then, a publisher's older message came after its
newer one, and became the subject's snapshot. A dropped request no copy of which was
numbered is named in its batch (``CommittedBatch.overtaken``) when the coordinator can
tell (:func:`_overtaken`): its publish fails for sure; else its publish times out as an
unknown outcome (it was not published).

A dropped request may be a copy of one already numbered: a non-seed that switches seeds
forwards its unanswered publishes again (:meth:`~cluster.publishing.ClusterPublishing.
resend_unanswered`), and some of them had committed through the seed it left. The
coordinator keeps the positions of each origin's most lately numbered requests
(:data:`RECENT_PER_ORIGIN` of the :data:`RECENT_ORIGINS` origins numbered most lately,
``recent``) and answers such a copy in the batch (``CommittedBatch.repeats``) with the
FIRST copy's position: never numbered twice, never a second position.

The coordinator holds only plain data (ints and dicts of ints) so that pysyncobj can
pickle it into its log snapshots; :meth:`Coordinator.to_state` /
:meth:`Coordinator.from_state` give the same data as a plain dict.

In a Raft dump the numbering is one ``bytes`` (pickled and compressed, with its CRC-32:
:mod:`cluster.dump_decoder`): unpickled whole on pysyncobj's Raft thread, a million
subjects' numbering was ~2 s of it, with no AppendEntries answered and no vote. A
coordinator loaded from a dump has its ``clsn`` and subject count at once and its
numbering once :meth:`Coordinator.begin_decoding`'s thread has decoded it
(:meth:`Coordinator.settle`); whatever reads or numbers before that waits for it. The
Raft consumer numbers nothing meanwhile: it holds the batches committed in between
(``cluster/raft_consumer.py``).
"""

from __future__ import annotations

import collections
import itertools
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from cluster.numbering_state import (
    GROUP_COUNT,
    NumberedPositions,
    _is_count,
    _is_epoch,
    _Numbering,
    _numbering,
    seqs_sum,
    subject_group,
)
from migratory.model.cache import encoded_bound
from migratory.model.frozen import positional_constructor
from migratory.model.message import Message, MessageType, Qos, new_message
from migratory.model.position import EPOCH_LIMIT, Position

if TYPE_CHECKING:  # (imported where a dump is written or read: it runs a thread; the link
    # modules import this one and stay free of threads, test_link_imports_no_io_transitively)
    from cluster.dump_decoder import DumpDecoding

__all__ = [
    "GROUP_COUNT",
    "UNNUMBERED_EPOCH",
    "CommittedBatch",
    "Coordinator",
    "NumberedPositions",
    "PublishRequest",
    "subject_group",
]

T = TypeVar("T")

UNNUMBERED_EPOCH: Final = 1
"""The epoch every member's hub gives a subject the cluster has not numbered yet.

A subscriber that saw nothing of such a subject resumes from ``(UNNUMBERED_EPOCH, 0)``
on any member. The coordinator never gives this epoch to a subject group.
"""


ORIGINS_KEPT: Final = 10_000
"""The origins whose last numbered ref the coordinator keeps (those numbered most lately;
an origin is a member's process, so a new one comes with each member's restart)."""

RECENT_PER_ORIGIN: Final = 4096
"""The positions of an origin's most lately numbered requests kept at least (at most a
quarter more: the window is cut back to this many when it grows past that)."""
RECENT_ORIGINS: Final = 64
"""The origins (numbered most lately) whose recent positions are kept."""
_SEQ_MASK: Final = (1 << 64) - 1


def _overtaken(window: dict[int, int], ref: int) -> bool:
    """Whether a request of ref ``ref`` that was dropped and is not in its origin's
    ``window`` of recent positions (refs numbered, oldest first) was never numbered and
    never will be. An origin's refs are numbered in growing order (``in_origin_order``),
    so the window holds EVERY ref numbered from its oldest one on: a ref at or above it
    and not in it was never numbered; and the origin's last numbered ref, above it, only
    grows, so every later copy is dropped too. Below the window's oldest ref (or with no
    window: evicted, a dump of the code before) it may have been numbered: not known."""
    oldest = next(iter(window), None)
    return oldest is not None and ref >= oldest


@dataclass(frozen=True, slots=True)
class PublishRequest:
    """A publish taken from a client by member ``origin``, not numbered yet.

    ``ref`` is the origin's own id for the publish, to route the outcome back to the
    client (its closure).
    """

    origin: str
    ref: int
    message: Message


new_publish_request = positional_constructor(PublishRequest)
"""``PublishRequest(origin, ref, message)`` at half the cost (decoding a ``Forward``)."""

REQUEST_FRAMING: Final = 64
"""A request's CBOR framing in a link frame, at most: its ``[origin, ref, M]`` array
and the message's epoch, seq, flags and type (and its ``[origin, ref]`` in a batch)."""


def request_bytes(request: PublishRequest) -> int:
    """What ``request`` takes at most in a ``Forward`` frame or in the ``Batch`` of its
    command: its message as a cache counts it, its closure, its origin and framing.
    Counting the content alone let a command (and a forward) of many publishes with
    small content and large fields or closures grow past the link's frame limit."""
    message = request.message
    closure = message.closure
    return (encoded_bound(message) + (len(closure.encode()) if closure else 0)
            + len(request.origin) + REQUEST_FRAMING)


@dataclass(frozen=True, slots=True)
class CommittedBatch:
    """One committed batch, numbered: the unit every member applies in CLSN order.

    ``messages`` are positioned, of type UPDATE, without closure; ``origins[i]`` is the
    ``(origin, ref)`` of ``messages[i]``. ``repeats`` are ``(origin, ref, epoch, seq)``
    of requests in the batch that were copies of one numbered before, at that one's
    position (not numbered again). ``overtaken`` are the ``(origin, ref)`` of requests
    in the batch that were never numbered and never will be
    (:meth:`Coordinator.in_origin_order` dropped them, and no copy was numbered): their
    publishes failed for sure.
    """

    clsn: int
    messages: tuple[Message, ...]
    origins: tuple[tuple[str, int], ...]
    repeats: tuple[tuple[str, int, int, int], ...] = ()
    overtaken: tuple[tuple[str, int], ...] = ()


class Coordinator:
    """Replicated numbering state: the cluster log sequence number, epochs and seqs.

    ``clsn`` counts applied batches (1, 2, 3, ...); ``group_epochs`` maps a subject
    group to its epoch; ``seqs`` maps a subject to the seq of its last message;
    ``origin_refs`` maps an origin to the ref of its last numbered request (the
    :data:`ORIGINS_KEPT` most lately numbered, oldest first); ``recent`` maps an origin to
    ``{ref: epoch << 64 | seq}`` of its last numbered requests (module docstring; one
    int, not a tuple: the dicts hold no container, so the collector never walks them).
    """

    def __init__(self) -> None:
        self.clsn: int = 0
        self.group_epochs: dict[int, int] = {}
        self.seqs: dict[str, int] = {}
        self.origin_refs: dict[str, int] = {}
        self.recent: dict[str, dict[int, int]] = {}
        self._seqs_sum = 0  # seqs_sum(self.seqs), kept up to date (digest)
        self._later: DumpDecoding[_Numbering] | None = None
        self._subjects = 0  # the dump's subject count, while its numbering decodes

    # pickled (into a Raft dump, by the dump's writer): the numbering as one bytes
    def __getstate__(self) -> dict[str, Any]:
        from cluster.dump_decoder import encode

        self.settle()
        packed, crc = encode((self.group_epochs, self.seqs, self.origin_refs, self.recent))
        return {"clsn": self.clsn, "numbering": packed, "crc": crc, "subjects": len(self.seqs),
                "seqs_sum": self._seqs_sum}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """From :meth:`__getstate__` (the numbering decoded later: :meth:`begin_decoding`),
        or a coordinator pickled whole by the code before (without ``origin_refs`` or
        ``recent``, an older dump: none yet)."""
        from cluster.dump_decoder import DumpDecoding

        self.__init__()  # type: ignore[misc]
        if "numbering" not in state:
            self.__dict__.update(state)
            self._seqs_sum = seqs_sum(self.seqs)  # (once, on a dump of the code before)
            return
        self.clsn = state["clsn"]
        self._subjects = state["subjects"]
        self._seqs_sum = state["seqs_sum"]
        self._later = DumpDecoding(
            state["numbering"], state["crc"], _numbering, "numbered subjects")

    @property
    def decoding(self) -> bool:
        """Whether the numbering of the dump this was loaded from is not taken yet."""
        return self._later is not None

    def begin_decoding(self) -> None:
        """Decode the dump's numbering in a thread of its own from now on (nothing to do
        for a coordinator not loaded from a dump of this code)."""
        if self._later is not None:
            self._later.begin()

    def settle(self, wait: bool = True) -> bool:
        """Take the dump's decoded numbering (waiting for it if ``wait``; decoding it here
        if no thread does); whether this coordinator has its numbering.
        :class:`~cluster.dump_decoder.DumpDecodeError` if it does not decode."""
        later = self._later
        if later is None:
            return True
        if not wait and not later.done():
            return False
        (self.group_epochs, self.seqs, self.origin_refs, self.recent), _ = later.result()
        self._later = None
        return True

    @property
    def subject_count(self) -> int:
        """Subjects numbered (the dump's count while its numbering decodes)."""
        return self._subjects if self._later is not None else len(self.seqs)

    def __repr__(self) -> str:
        return (
            f"<Coordinator clsn={self.clsn}, {len(self.group_epochs)} groups,"
            f" {len(self.seqs)} subjects>"
        )

    def apply_batch(
        self, epoch_candidate: int, requests: Sequence[PublishRequest]
    ) -> CommittedBatch:
        """Number a committed batch of requests, in order, and advance the CLSN.

        A group used for the first time takes ``epoch_candidate`` as its epoch (the
        submitter draws it at random with ``new_epoch()``, so a cluster that lost all
        its Raft state starts new lineages); ``UNNUMBERED_EPOCH`` is taken as the next
        integer. Raises ValueError, changing nothing, for a candidate outside
        ``[1, 2**48)``.
        """
        if not 1 <= epoch_candidate < EPOCH_LIMIT:
            raise ValueError(f"epoch candidate must be in [1, 2**48), got {epoch_candidate}")
        if epoch_candidate == UNNUMBERED_EPOCH:
            epoch_candidate += 1
        if self._later is not None:
            self.settle()
        keys = [(r.origin, r.ref) for r in requests]
        kept = self.in_origin_order(requests, keys)
        messages = tuple(
            self._number(
                epoch_candidate, m.subject, m.content, m.fields, m.retained, m.qos
            )
            for m in (r.message for r in kept)
        )
        origins = tuple((r.origin, r.ref) for r in kept)
        repeats, overtaken = self._remember(origins, messages, keys)
        self.clsn += 1
        return CommittedBatch(self.clsn, messages, origins, repeats, overtaken)

    def apply_wire(
        self,
        epoch_candidate: int,
        wire: Sequence[tuple[str, int, str, bytes, Mapping[str, str], bool, bool]],
    ) -> CommittedBatch:
        """:meth:`apply_batch` for requests as plain tuples ``(origin, ref, subject,
        content, fields, retained, guaranteed)``: the Raft hot path, which builds each
        committed message once, already numbered."""
        if not 1 <= epoch_candidate < EPOCH_LIMIT:
            raise ValueError(f"epoch candidate must be in [1, 2**48), got {epoch_candidate}")
        if epoch_candidate == UNNUMBERED_EPOCH:
            epoch_candidate += 1
        if self._later is not None:
            self.settle()
        keys = [(w[0], w[1]) for w in wire]
        kept = self.in_origin_order(wire, keys)
        number = self._number
        messages = tuple(
            number(epoch_candidate, subject, content, fields, retained,
                   Qos.GUARANTEED if guaranteed else Qos.STANDARD)
            for _, _, subject, content, fields, retained, guaranteed in kept
        )
        origins = tuple((w[0], w[1]) for w in kept)
        repeats, overtaken = self._remember(origins, messages, keys)
        self.clsn += 1
        return CommittedBatch(self.clsn, messages, origins, repeats, overtaken)

    def in_origin_order(self, items: Sequence[T], keys: Sequence[tuple[str, int]]) -> list[T]:
        """``items`` (``keys[i]`` the ``(origin, ref)`` of ``items[i]``) without those
        whose ref is not above the last one numbered from their origin; records the
        last ref of each origin kept."""
        refs = self.origin_refs
        last: dict[str, int] = {}
        kept: list[T] = []
        for item, (origin, ref) in zip(items, keys, strict=True):
            before = last.get(origin)
            if before is None:
                before = refs.get(origin)
            if before is not None and ref <= before:
                continue  # an older publish of this origin, overtaken
            last[origin] = ref
            kept.append(item)
        for origin, ref in last.items():
            refs.pop(origin, None)  # the most lately numbered last
            refs[origin] = ref
        while len(refs) > ORIGINS_KEPT:
            del refs[next(iter(refs))]
        return kept

    def _remember(
        self,
        origins: tuple[tuple[str, int], ...],
        messages: tuple[Message, ...],
        keys: list[tuple[str, int]],
    ) -> tuple[tuple[tuple[str, int, int, int], ...], tuple[tuple[str, int], ...]]:
        """Keep the positions just numbered (``origins[i]`` at ``messages[i]``'s); the
        repeats among the requests of the batch (``keys``) that were not numbered: those
        whose (origin, ref) is kept, at the position kept; and the overtaken ones
        (:meth:`_overtaken`)."""
        recent = self.recent
        touched: dict[str, dict[int, int]] = {}
        last: str | None = None
        window: dict[int, int] = {}
        for (origin, ref), message in zip(origins, messages, strict=True):
            if origin != last:  # a batch holds runs of one origin's requests
                last = origin
                window = touched.get(origin) or touched.setdefault(
                    origin, recent.pop(origin, {}))
            window[ref] = message.epoch << 64 | message.seq
        for origin, window in touched.items():
            if len(window) > RECENT_PER_ORIGIN + RECENT_PER_ORIGIN // 4:
                window = dict(itertools.islice(
                    window.items(), len(window) - RECENT_PER_ORIGIN, None))
            recent[origin] = window  # the most lately numbered last
        while len(recent) > RECENT_ORIGINS:
            del recent[next(iter(recent))]
        if len(keys) == len(origins):
            return (), ()
        dropped = collections.Counter(keys)
        dropped.subtract(origins)
        repeats = []
        overtaken = []
        for (origin, ref), count in dropped.items():
            window = recent.get(origin, {})
            position = window.get(ref)
            if position is not None:
                repeats.extend([(origin, ref, position >> 64, position & _SEQ_MASK)] * count)
            elif count > 0 and _overtaken(window, ref):
                overtaken.extend([(origin, ref)] * count)
        return tuple(repeats), tuple(overtaken)

    def _number(
        self,
        epoch_candidate: int,
        subject: str,
        content: bytes,
        fields: Mapping[str, str],
        retained: bool,
        qos: Qos,
    ) -> Message:
        code = zlib.crc32(subject.encode("utf-8"))  # (subject_group's)
        epoch = self.group_epochs.setdefault(code % GROUP_COUNT, epoch_candidate)
        seqs = self.seqs
        before = seqs.get(subject, 0)
        seq = seqs[subject] = before + 1
        self._seqs_sum += hash((code, seq)) - hash((code, before))  # (digest)
        # new_message, not Message(): a frozen dataclass's __init__ was ~16 % of the
        # sequencer's CPU with Workers = 2 (py-spy, many subjects at 40,000 msg/s)
        return new_message(subject, content, fields, retained, qos, None, epoch, seq,
                           MessageType.UPDATE)

    def digest(self) -> str:
        """A fingerprint of the whole replicated state: equal on seeds that agree.

        pysyncobj 0.3.17 may log "truncating already-applied log entries" under load;
        tests compare digests across seeds to show the state machine did not diverge.

        Bounded work (the Raft thread computes it): every subject's seq is in it through
        ``_seqs_sum`` (:func:`seqs_sum`), kept up to date as subjects are numbered --
        sorting a million subjects' seqs here was 0.45 s of the Raft thread, longer than
        the election timeout (docs/benchmarks.md); each origin's window of recent
        positions through its length and its newest position (the windows are derived
        from the numbering, and up to 64 x 5,120 entries).
        """
        self.settle()
        recent = [(o, len(w), next(reversed(w.items()), None)) for o, w in self.recent.items()]
        state = repr((self.clsn, sorted(self.group_epochs.items()), len(self.seqs),
                      self._seqs_sum, list(self.origin_refs.items()), recent))
        return f"{self.clsn}:{zlib.crc32(state.encode()):08x}"

    def position(self, subject: str) -> Position | None:
        """The position of the last message of ``subject``, None if it has none."""
        self.settle()
        seq = self.seqs.get(subject)
        if seq is None:
            return None
        return Position(self.group_epochs[subject_group(subject)], seq)

    def positions(self) -> dict[str, tuple[int, int]]:
        """Every numbered subject's ``(epoch, seq)``."""
        self.settle()
        epochs = self.group_epochs
        return {s: (epochs[subject_group(s)], seq) for s, seq in self.seqs.items()}

    def positions_now(self) -> NumberedPositions:
        """:meth:`positions` as they stand now, each worked out only when read: two dict
        copies, in C (the Raft thread takes them when it loads a dump; working out a
        million positions there was ~1 s of it, docs/benchmarks.md)."""
        if self._later is not None:  # the copies made by the decoding thread
            return NumberedPositions({}, {}, self._later)
        return NumberedPositions(dict(self.seqs), dict(self.group_epochs))

    def to_state(self) -> dict[str, Any]:
        """The state as a plain dict (copies)."""
        self.settle()
        return {
            "clsn": self.clsn,
            "group_epochs": dict(self.group_epochs),
            "seqs": dict(self.seqs),
            "origin_refs": dict(self.origin_refs),
            "recent": {origin: dict(window) for origin, window in self.recent.items()},
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Coordinator:
        """A coordinator from :meth:`to_state`'s dict (without ``origin_refs`` or
        ``recent``: none yet, as an older version wrote it); ValueError if it is
        malformed."""
        clsn: object = state.get("clsn")
        group_epochs: object = state.get("group_epochs")
        seqs: object = state.get("seqs")
        origin_refs: object = state.get("origin_refs", {})
        recent: object = state.get("recent", {})
        if not _is_count(clsn):
            raise ValueError(f"clsn must be an int >= 0, got {clsn!r}")
        if not isinstance(group_epochs, Mapping) or not all(
            isinstance(g, int) and 0 <= g < GROUP_COUNT and _is_epoch(e)
            for g, e in group_epochs.items()
        ):
            raise ValueError(f"malformed group_epochs: {group_epochs!r}")
        if not isinstance(seqs, Mapping) or not all(
            isinstance(s, str) and _is_count(n) and subject_group(s) in group_epochs
            for s, n in seqs.items()
        ):
            raise ValueError(f"malformed seqs: {seqs!r}")
        if not isinstance(origin_refs, Mapping) or not all(
            isinstance(o, str) and isinstance(r, int) and not isinstance(r, bool)
            for o, r in origin_refs.items()
        ):
            raise ValueError(f"malformed origin_refs: {origin_refs!r}")
        if not isinstance(recent, Mapping) or not all(
            isinstance(o, str) and isinstance(w, Mapping) and all(
                _is_count(r) and _is_count(p) and _is_epoch(p >> 64) for r, p in w.items()
            )
            for o, w in recent.items()
        ):
            raise ValueError(f"malformed recent: {recent!r}")
        coordinator = cls()
        coordinator.clsn = clsn
        coordinator.group_epochs = dict(group_epochs)
        coordinator.seqs = dict(seqs)
        coordinator._seqs_sum = seqs_sum(coordinator.seqs)
        coordinator.origin_refs = dict(origin_refs)
        coordinator.recent = {origin: dict(window) for origin, window in recent.items()}
        return coordinator
