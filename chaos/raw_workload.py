"""The raw-protocol clients of the workload: publishers and auditors, no SDK logic.

- A raw publisher sends Poisson arrivals pipelined on one connection (closure =
  msg_id), matches each ``PublishStatus`` by closure, and on a lost connection records
  every unanswered publish as outcome unknown (``info``) before moving to the next
  member. An arrival while it has no connection is recorded ``fail`` (not sent).
- A raw auditor subscribes with the last (epoch, seq) it saw per subject (a message's,
  a resync's, or its fresh subscribe's; none at first), records
  every delivered message and subject status as it arrived, with no dedupe, no
  ordering and no gap repair, so any server fault stays visible.

Both notice a stalled member by a protocol ping every 1 s answered within 2 s.
"""

from __future__ import annotations

import trio

from chaos.plan import PublisherPlan, SubscriberPlan
from chaos.rawtrio import RawSession
from chaos.schedule import member
from chaos.workload import MAX_IN_FLIGHT, PUBLISH_TIMEOUT, Workload
from migratory.model.message import Message, Qos
from migratory.protocol import ops

PING_EVERY, PONG_TIMEOUT = 1.0, 2.0
JUMPS = ("DATA_RESYNC", "SUBSCRIBE_ALLOW")  # statuses whose position an auditor resumes from
LINK_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


class RawPublisher:
    def __init__(self, workload: Workload, spec: PublisherPlan) -> None:
        self.w, self.spec = workload, spec
        self.arrivals = workload.arrivals(spec)
        self.session: RawSession | None = None
        self.mname: str | None = None
        # closure -> (msg_id, subject, member, invoke time, deadline)
        self.pending: dict[str, tuple[str, str, str | None, float, float]] = {}

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._connections)
            nursery.start_soon(self._expire)
            try:
                await self._arrivals()
                with trio.move_on_after(PUBLISH_TIMEOUT + 1):
                    while self.pending:
                        await trio.sleep(0.1)
            finally:
                self._unknown("no status before the run ended")
            nursery.cancel_scope.cancel()

    def _unknown(self, reason: str) -> None:
        pending, self.pending = self.pending, {}
        for msg_id, subject, target, _, _ in pending.values():
            self.w.record_publish(self.spec.name, "info", msg_id, subject, target, reason=reason)

    async def _arrivals(self) -> None:
        name, w = self.spec.name, self.w
        while w.publishing:
            await trio.sleep_until(self.arrivals.due(trio.current_time()))
            msg_id, subject, content, fields, retained, guaranteed = self.arrivals.next()
            session, target = self.session, self.mname
            qos_name = "guaranteed" if guaranteed else "standard"
            w.record_publish(name, "invoke", msg_id, subject, target, qos=qos_name)
            if session is None or len(self.pending) >= MAX_IN_FLIGHT:
                why = "no connection" if session is None else f"{len(self.pending)} in flight"
                w.record_publish(name, "fail", msg_id, subject, target, reason=f"not sent: {why}")
                continue
            qos = Qos.GUARANTEED if guaranteed else Qos.STANDARD
            now = w.h.now()
            self.pending[msg_id] = (msg_id, subject, target, now, now + PUBLISH_TIMEOUT)
            try:
                await session.publish(Message(subject, content, fields, retained, qos, msg_id))
            except LINK_ERRORS:
                if self.pending.pop(msg_id, None) is not None:
                    reason = "connection lost while sending"
                    w.record_publish(name, "info", msg_id, subject, target, reason=reason)

    async def _expire(self) -> None:
        while True:
            await trio.sleep(0.5)
            now = self.w.h.now()
            for closure, (msg_id, subject, target, _, deadline) in list(self.pending.items()):
                if deadline < now:
                    del self.pending[closure]
                    reason = f"no status in {PUBLISH_TIMEOUT} s"
                    self.w.record_publish(
                        self.spec.name, "info", msg_id, subject, target, reason=reason
                    )

    def _status(self, op: ops.PublishStatus) -> None:
        entry = self.pending.pop(op.closure or "", None)
        if entry is None:
            return  # already given up on (recorded as outcome unknown)
        msg_id, subject, target, invoked, _ = entry
        name = self.spec.name
        if op.status is ops.Status.PUBLISH_OK and op.position is not None:
            pos = op.position
            self.w.record_publish(
                name, "ok", msg_id, subject, target, invoked, epoch=pos.epoch, seq=pos.seq
            )
        else:
            reason = f"{op.status.value}: {op.reason}"
            self.w.record_publish(name, "fail", msg_id, subject, target, reason=reason)

    async def _connections(self) -> None:
        idx = self.spec.prefer
        n = self.w.n
        for _ in range(1_000_000):
            url, mname = self.w.client_urls[idx], member(idx)
            try:
                with trio.fail_after(3):
                    session = await RawSession.open(_port(url), self.spec.name)
            except Exception:  # refused, 1013 while syncing, paused member, ...
                idx = (idx + 1) % n
                await trio.sleep(0.1)
                continue
            reason = "closed"
            try:
                async with session:
                    self.session, self.mname = session, mname
                    async for op in session.ops(ping_every=PING_EVERY, pong_timeout=PONG_TIMEOUT):
                        if isinstance(op, ops.PublishStatus):
                            self._status(op)
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
            finally:
                self.session = None
                self._unknown(f"connection lost ({reason[:60]})")
            self.w.say(f"raw publisher {self.spec.name} lost {mname} ({reason[:80]})")
            idx = (idx + 1) % n
            await trio.sleep(0.1)


async def raw_publisher(workload: Workload, spec: PublisherPlan) -> None:
    await RawPublisher(workload, spec).run()


async def raw_auditor(w: Workload, spec: SubscriberPlan, ready: trio.Event) -> None:
    """Protocol-level subscriber: resume by last position seen, no dedupe, no gap repair."""
    name = spec.name
    w.seen[name] = set()
    last: dict[str, tuple[int, int]] = {}
    idx = spec.prefer
    for _ in range(1_000_000):
        url, mname = w.client_urls[idx], member(idx)
        try:
            with trio.fail_after(3):
                session = await RawSession.open(_port(url), name)
        except Exception:  # refused, 1013 while syncing, paused member, ...
            idx = (idx + 1) % w.n
            await trio.sleep(0.1)
            continue
        w.record_subscription(name, "raw", None, "SERVER_UP", mname)
        reason = "closed"
        try:
            async with session:
                await session.subscribe(
                    [(s, last.get(s)) for s in spec.subjects], history=spec.history
                )
                for s in spec.subjects:
                    e, q = last.get(s, (None, None))
                    w.record_subscription(name, "raw", s, "subscribed", mname, e, q)
                ready.set()
                async for op in session.ops(ping_every=PING_EVERY, pong_timeout=PONG_TIMEOUT):
                    if isinstance(op, ops.Deliver):
                        for m in op.messages:
                            # resume from the highest seq seen in the epoch: a late
                            # (reordered) message must not move the auditor back
                            seen = last.get(m.subject)
                            if seen is None or seen[0] != m.epoch or m.seq > seen[1]:
                                last[m.subject] = (m.epoch, m.seq)
                            w.record_delivery(name, "raw", mname, m)
                    elif isinstance(op, ops.SubjectStatus):
                        pos = op.position
                        # a resync's position, and a fresh subscribe's (a resume's
                        # SUBSCRIBE_ALLOW has none): resumed from, as the SDK does
                        if op.status.value in JUMPS and pos is not None:
                            last[op.subject] = (pos.epoch, pos.seq)
                        e, q = (pos.epoch, pos.seq) if pos else (None, None)
                        event = op.status.value
                        w.record_subscription(name, "raw", op.subject, event, mname, e, q)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
        w.record_subscription(name, "raw", None, "SERVER_DOWN", mname)
        w.say(f"auditor {name} lost {mname} ({reason[:80]})")
        idx = (idx + 1) % w.n
        await trio.sleep(0.1)
