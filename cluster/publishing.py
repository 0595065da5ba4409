"""Guaranteed-mode publishing: acknowledged once Raft has committed it.

A member takes a publish from a client, gives it a reference ``(origin,
ref)`` — origin names this member *and this process's incarnation*, so a
restarted member never mistakes an old commit for a new publish — and queues
it. The runtime hands the queued requests to Raft (seed) or to a seed
(non-seed) in batches. The answer comes from the committed stream itself:
when a committed batch carrying one of our references is applied, the client
gets ``PUBLISH_OK`` with the position the coordination assigned. A definite
refusal gives ``PUBLISH_FAILED``; an unknown outcome keeps waiting for the
stream until ``publish_timeout`` and then reports ``PUBLISH_FAILED`` saying
the outcome is unknown — never a false ``PUBLISH_OK``. A member that jumps to a
cache sync never sees the batches the sync replaced: what was pending then has an
unknown outcome too, and no later "definite" failure is believed for it. At
most ``max_pending`` publishes wait for their commit; one more is refused at
once with ``PUBLISH_FAILED`` ("overloaded") instead of queueing without bound.

A non-seed that switches seeds forwards its unanswered publishes again, oldest first
and ahead of the newer ones (:meth:`ClusterPublishing.resend_unanswered`): those lost
with the seed it left commit now, and a copy of one that had committed is answered
in the batch with the first copy's position (``CommittedBatch.repeats``,
:mod:`cluster.coordination`). A publish forwarded twice believes no seed's definite
failure (the other copy may still commit): only a commit, or the timeout. A seed's
definite failure of a copy is counted (``copies_refused``): that copy never reached the
coordinator, so it could not be answered as a repeat -- its publish is answered by the
first copy's batch, or times out. A copy the coordinator dropped, overtaken by newer
publishes of this member and found in no window of numbered ones, is the coordinator's
word for the publish (``CommittedBatch.overtaken``): never numbered, never to be; it
fails at once (``PUBLISH_FAILED``), resent or not, after a sync or not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cluster.coordination import CommittedBatch, PublishRequest, request_bytes
from cluster.replica import Offer, Replica
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.server.context import PublishReply
from migratory.server.metric_figures import PublishTimings

OVERTAKEN = ("not published: newer publishes of this member were published before it "
             "(publish again)")
"""The reason of a publish the coordinator found overtaken (``CommittedBatch.overtaken``)."""


@dataclass(slots=True)
class _Pending:
    reply: PublishReply | None
    closure: str | None
    subject: str
    submitted_at: float
    request: PublishRequest
    unknown_since: float | None = None
    resent: bool = False
    """Forwarded again through another seed: a seed's definite failure of one copy says
    nothing of the other."""
    jumped: bool = False
    """The member jumped to a cache sync while this waited: it may have been committed
    in a batch the sync replaced (no acknowledgement from those)."""


@dataclass(slots=True)
class PublishingStatistics:
    submitted: int = 0
    acknowledged: int = 0
    failed: int = 0
    unknown_outcome: int = 0
    overloaded: int = 0
    batches_applied: int = 0
    gaps: int = 0
    resent: int = 0
    repeats: int = 0
    """Copies of this member's publishes that the coordinator found numbered already."""
    acknowledged_repeats: int = 0
    """Publishes acknowledged from such a copy (the first one's batch was not seen here)."""
    copies_refused: int = 0
    """Copies a seed refused for sure (never numbered, so never a repeat either: a Raft
    leader change while they were on their way, say); the publish waited for its first
    copy's batch or the timeout."""
    overtaken: int = 0
    """Publishes failed because the coordinator dropped them, overtaken by newer ones of
    this member, never to be numbered (``CommittedBatch.overtaken``)."""


class ClusterPublishing:
    """The :class:`~migratory.server.context.PublishPath` of a Guaranteed cluster member."""

    commits_elsewhere = True
    """This member's copy of the stream may lag the commit: reads that must see every
    earlier commit wait for a read barrier (:mod:`migratory.server.read_barrier`)."""

    def __init__(
        self,
        *,
        origin: str,
        replica: Replica,
        publish_timeout: float = 10.0,
        max_pending: int = 50_000,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.origin = origin
        self.replica = replica
        self.publish_timeout = publish_timeout
        self.max_pending = max_pending
        self._next_ref = 0
        self._taken_ref = 0  # the last ref take_outgoing handed out (refs go in order)
        self._pending: dict[int, _Pending] = {}
        self._outgoing: list[PublishRequest] = []
        self._copies: dict[int, float] = {}
        """ref -> when it went again, oldest first: a seed's definite failure of the copy
        may come after the first copy's batch answered the publish (until the timeout)."""
        self.stats = PublishingStatistics()
        self.timings = PublishTimings()  # submit -> applied here / acknowledged (/metrics)
        self.on_outgoing: Callable[[], None] | None = None  # first request queued

    # --- from clients ---------------------------------------------------------

    def submit(self, message: Message, reply: PublishReply | None, now: float) -> None:
        if len(self._pending) >= self.max_pending:
            self.stats.overloaded += 1
            if reply is not None:
                reason = (
                    f"overloaded: {len(self._pending)} publishes are waiting for their commit "
                    f"(ClusterMaxPendingPublishes); retry later"
                )
                reply.publish_result(
                    ops.PublishStatus(
                        ops.Status.PUBLISH_FAILED, message.closure, message.subject, None, reason
                    )
                )
            return
        self._next_ref += 1
        ref = self._next_ref
        request = PublishRequest(self.origin, ref, message)
        self._pending[ref] = _Pending(reply, message.closure, message.subject, now, request)
        if not self._outgoing and self.on_outgoing is not None:
            self.on_outgoing()
        self._outgoing.append(request)
        self.stats.submitted += 1

    def take_outgoing(self, max_bytes: int | None = None) -> list[PublishRequest]:
        """The requests to submit now, in the order clients published them: all of them,
        or as many as fit in ``max_bytes`` (:func:`~cluster.coordination.request_bytes`:
        content, subject, fields, closure; always at least one)."""
        if max_bytes is None:
            outgoing, self._outgoing = self._outgoing, []
        else:
            size = 0
            count = 0
            for request in self._outgoing:
                size += request_bytes(request)
                if count and size > max_bytes:
                    break
                count += 1
            outgoing, self._outgoing = self._outgoing[:count], self._outgoing[count:]
        if outgoing:
            self._taken_ref = max(self._taken_ref, outgoing[-1].ref)
        return outgoing

    def resend_unanswered(self, now: float) -> int:
        """A non-seed linked to another seed: the publishes taken before and still
        unanswered go out again, oldest first, ahead of those never taken (the order of
        refs the coordinator numbers in). Only those younger than half the publish
        timeout: a seed may hold a forward that long before it is sent to Raft
        (:func:`cluster.raft_forward.hold_deadline`), and none may commit after its
        publisher was answered. Returns how many."""
        limit = now - self.publish_timeout / 2
        queued = {request.ref for request in self._outgoing}  # a link that ended at once
        again = []
        for ref, pending in self._pending.items():
            if ref > self._taken_ref:
                break  # the rest were never taken: still queued, in order
            if pending.submitted_at >= limit and ref not in queued:
                pending.resent = True
                again.append(pending.request)
                self._copies.pop(ref, None)  # (the most lately sent last)
                self._copies[ref] = now
        if again:
            if not self._outgoing and self.on_outgoing is not None:
                self.on_outgoing()
            self._outgoing[:0] = again
            self.stats.resent += len(again)
        return len(again)

    @property
    def outgoing(self) -> int:
        """Publishes queued, not taken yet."""
        return len(self._outgoing)

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def last_ref(self) -> int:
        """The ref of the last publish taken from a client (0: none yet)."""
        return self._next_ref

    def waiting_up_to(self, ref: int) -> bool:
        """Whether a publish taken up to ``ref`` still waits for its outcome."""
        oldest = next(iter(self._pending), None)  # (refs are pending in their order)
        return oldest is not None and oldest <= ref

    def oldest_submitted(self, origins: list[tuple[str, int]]) -> float | None:
        """When the oldest of this member's publishes among ``origins`` still waiting was
        submitted (``None``: none waits any more)."""
        times = [
            p.submitted_at
            for origin, ref in origins
            if origin == self.origin and (p := self._pending.get(ref)) is not None
        ]
        return min(times, default=None)

    # --- from the coordination --------------------------------------------------

    def on_committed(self, batch: CommittedBatch, now: float) -> Offer:
        """Apply a committed batch to the hub and acknowledge our publishes in it."""
        offer = self.replica.offer(batch, now)
        if offer is Offer.GAP:
            self.stats.gaps += 1
        elif offer is Offer.APPLIED:
            self.stats.batches_applied += 1
        replies: dict[int, PublishReply] = {}
        if batch.repeats or batch.overtaken:
            self._acknowledge_with_repeats(batch, replies, now)
        else:
            for (origin, ref), message in zip(batch.origins, batch.messages, strict=True):
                if origin == self.origin:
                    self._acknowledge(ref, message.position, replies, now)
        for reply in replies.values():
            reply.flush()
        return offer

    def _fail_overtaken(self, ref: int, replies: dict[int, PublishReply]) -> None:
        """The coordinator dropped a copy of this publish, never numbered and never to be
        (``CommittedBatch.overtaken``): failed for sure, whatever copy or sync came before
        -- the coordinator's word for the publish, not a seed's for one copy."""
        pending = self._pending.pop(ref, None)
        if pending is not None:
            self.stats.overtaken += 1
            self._fail(pending, OVERTAKEN, replies)

    def _acknowledge_with_repeats(
        self, batch: CommittedBatch, replies: dict[int, PublishReply], now: float
    ) -> None:
        """Answer this member's publishes of a batch that holds repeats (copies of
        publishes numbered before) or overtaken ones (never numbered, never to be) in ref
        order, the order its clients published them: a repeat is older than what the batch
        numbers, and answered after it, a PUBACK overtook an earlier PUBLISH's (MQTT 3.1.1
        section 4.6 wants them in order)."""
        ours: list[tuple[int, Position | None, bool]] = [
            (ref, message.position, False) for (origin, ref), message
            in zip(batch.origins, batch.messages, strict=True) if origin == self.origin]
        for origin, ref, epoch, seq in batch.repeats:  # numbered before, there
            if origin == self.origin:
                self.stats.repeats += 1
                ours.append((ref, Position(epoch, seq), True))
        ours.extend((ref, None, False) for origin, ref in batch.overtaken
                    if origin == self.origin)
        ours.sort(key=lambda answer: answer[0])
        for ref, position, repeat in ours:
            if position is None:
                self._fail_overtaken(ref, replies)
            elif self._acknowledge(ref, position, replies, now) and repeat:
                self.stats.acknowledged_repeats += 1

    def _acknowledge(
        self, ref: int, position: Position | None, replies: dict[int, PublishReply], now: float
    ) -> bool:
        pending = self._pending.pop(ref, None)
        if pending is None:
            return False
        self.stats.acknowledged += 1
        elapsed = now - pending.submitted_at  # one per publish, not per delivery
        self.timings.fanout.observe(elapsed)
        if pending.reply is not None:
            self.timings.ack.observe(elapsed)
            pending.reply.publish_result(
                ops.PublishStatus(ops.Status.PUBLISH_OK, pending.closure, pending.subject, position)
            )
            replies[id(pending.reply)] = pending.reply
        return True

    def on_failed(
        self, origins: list[tuple[str, int]], reason: str, *, unknown: bool, now: float,
        status: ops.Status = ops.Status.PUBLISH_FAILED,
    ) -> None:
        """Raft refused a batch (definite) or could not say whether it committed (unknown);
        ``status``: what a definite failure answers (a seed's check of a forwarded publish
        says ``MESSAGE_SIZE_LIMIT_EXCEEDED`` or ``PUBLISH_DENIED`` too)."""
        replies: dict[int, PublishReply] = {}
        for origin, ref in origins:
            if origin != self.origin:
                continue
            if not unknown and self._copies.pop(ref, None) is not None:
                self.stats.copies_refused += 1
            pending = self._pending.get(ref)
            if pending is None:
                continue
            if unknown or pending.jumped or pending.resent:
                if pending.unknown_since is None:
                    pending.unknown_since = now
                continue
            del self._pending[ref]
            self._fail(pending, f"not published: {reason}", replies, status)
        for reply in replies.values():
            reply.flush()

    def on_jump(self, now: float) -> None:
        """The member installed a cache sync instead of batches (a peer's, or a Raft
        dump's): whatever is pending may be committed in a batch it will never see, so
        its outcome is unknown. A definite failure said later (a barrier settling what
        Raft could not tell) cannot be trusted for it: it waits for the timeout."""
        for pending in self._pending.values():
            pending.jumped = True
            if pending.unknown_since is None:
                pending.unknown_since = now

    def expire(self, now: float) -> int:
        """Give up on publishes whose commit was not seen within ``publish_timeout``.
        One still queued (never taken: the forward to the upstream seed is stuck) leaves
        the queue too: it is never submitted, and the queue holds no more than
        ``max_pending`` publishes, however long nothing takes them."""
        expired = [
            ref
            for ref, pending in self._pending.items()
            if now - pending.submitted_at > self.publish_timeout
        ]
        copies = self._copies
        while copies and now - next(iter(copies.values())) > self.publish_timeout:
            del copies[next(iter(copies))]  # no seed answers a copy that late
        if expired and self._outgoing:
            gone = set(expired)
            self._outgoing = [r for r in self._outgoing if r.ref not in gone]
        replies: dict[int, PublishReply] = {}
        for ref in expired:
            pending = self._pending.pop(ref)
            self.stats.unknown_outcome += 1
            self._fail(
                pending,
                f"outcome unknown: no commit seen within {self.publish_timeout:g} s",
                replies,
            )
        for reply in replies.values():
            reply.flush()
        return len(expired)

    def _fail(
        self, pending: _Pending, reason: str, replies: dict[int, PublishReply],
        status: ops.Status = ops.Status.PUBLISH_FAILED,
    ) -> None:
        self.stats.failed += 1
        if pending.reply is not None:
            pending.reply.publish_result(
                ops.PublishStatus(status, pending.closure, pending.subject, None, reason))
            replies[id(pending.reply)] = pending.reply

    def statistics(self) -> dict[str, Any]:
        stats = self.stats
        return {
            "mode": "guaranteed",
            "origin": self.origin,
            "pending": len(self._pending),
            "submitted": stats.submitted,
            "acknowledged": stats.acknowledged,
            "failed": stats.failed,
            "unknown_outcome": stats.unknown_outcome,
            "overloaded": stats.overloaded,
            "batches_applied": stats.batches_applied,
            "gaps": stats.gaps,
            "resent": stats.resent,
            "repeats": stats.repeats,
            "acknowledged_repeats": stats.acknowledged_repeats,
            "copies_refused": stats.copies_refused,
            "overtaken": stats.overtaken,
            "applied_clsn": self.replica.applied_clsn,
        }
