"""The recorded workload: SDK publishers, SDK subscribers and raw-protocol auditors.

Every publish (invoke / ok / fail / info), delivery and subscription event goes to
the history. A publish's content is ``"<msg_id>|chaos"`` so that any subscriber can
tell which publish it received (:func:`parse_id`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from chaos.history import History
from chaos.schedule import member

if TYPE_CHECKING:
    from migratory.model.message import Message

SUBJECTS = tuple(f"/chaos/s{i}" for i in range(4))


def parse_id(content: bytes) -> str | None:
    """The msg_id of a publish of this workload, None for any other content."""
    text = content.decode("utf-8", "replace")
    head, sep, tail = text.partition("|")
    return head if sep and tail == "chaos" and head.startswith("p") else None


class Workload:
    def __init__(
        self,
        *,
        seed: int,
        client_urls: list[str],
        history: History,
        say: Callable[[str], None],
        publishers: int,
        rate: float,
    ) -> None:
        """``client_urls[i]`` reaches member i; ``rate`` is publishes/s over all publishers."""
        self.seed, self.client_urls, self.h, self.say = seed, client_urls, history, say
        self.n, self.n_pub, self.rate = len(client_urls), publishers, rate
        self.url_to_member = {url: member(i) for i, url in enumerate(client_urls)}
        self.acked: dict[str, set[str]] = {s: set() for s in SUBJECTS}
        self.seen: dict[str, set[str]] = {}  # subscriber -> msg_ids delivered to it
        self.stats = {"ok": 0, "fail": 0, "info": 0, "deliveries": 0}
        self.publishing = True

    def member_of(self, url: str | None) -> str | None:
        return self.url_to_member.get(url or "", url)

    def servers_for(self, prefer: int) -> list[str]:
        return [f"{100 if i == prefer else 10} {u}" for i, u in enumerate(self.client_urls)]

    def drained(self) -> bool:
        """Every acknowledged publish has reached every subscriber and auditor."""
        want = set().union(*self.acked.values())
        return all(want <= seen for seen in self.seen.values())

    # --- history -----------------------------------------------------------------------

    def _record_publish(
        self,
        publisher: str,
        event: str,
        msg_id: str,
        subject: str,
        target: str | None,
        **result: Any,
    ) -> None:
        """A ``publishes`` line: ``event`` is invoke | ok | fail | info; ``result`` holds
        epoch and seq (ok) or the reason (fail, info)."""
        self.h.write(
            "publishes",
            publisher=publisher,
            type=event,
            msg_id=msg_id,
            subject=subject,
            member=target,
            **result,
        )

    def _record_subscription(
        self,
        subscriber: str,
        kind: str,
        subject: str | None,
        event: str,
        member_name: str | None,
        epoch: int | None = None,
        seq: int | None = None,
    ) -> None:
        self.h.write(
            "subscriptions",
            subscriber=subscriber,
            kind=kind,
            subject=subject,
            event=event,
            member=member_name,
            epoch=epoch,
            seq=seq,
        )

    def _record_delivery(
        self, subscriber: str, kind: str, member_name: str | None, message: Message
    ) -> None:
        msg_id = parse_id(message.content)
        if msg_id:
            self.seen[subscriber].add(msg_id)
        self.h.write(
            "deliveries",
            subscriber=subscriber,
            kind=kind,
            member=member_name,
            subject=message.subject,
            epoch=message.epoch,
            seq=message.seq,
            msg_id=msg_id,
            type=str(message.type),
        )

    def record_unsubscribed(self) -> None:
        """The end of the run: every subscriber and auditor unsubscribes from every subject."""
        for name in self.seen:
            kind = "raw" if name.startswith("a") else "sdk"
            for s in SUBJECTS:
                self._record_subscription(name, kind, s, "unsubscribed", None)

    # --- tasks -------------------------------------------------------------------------

    async def publisher(self, k: int) -> None:
        import migratory_client as mc

        name = f"p{k}"
        rng = random.Random(self.seed * 1000 + k)
        policy = mc.ReconnectPolicy(initial_delay=0.05, max_delay=0.5, connect_timeout=2.0)
        async with mc.connect(
            self.servers_for(k % self.n),
            name=name,
            reconnect=policy,
            keepalive=mc.Keepalive(interval=1.0, timeout=2.0),
            rng=random.Random(rng.random()),
        ) as client:
            n = 0
            while self.publishing and n < 10_000_000:
                n += 1
                msg_id = f"{name}-{n}"
                subject = rng.choice(SUBJECTS)
                target = self.member_of(client.server)
                self._record_publish(name, "invoke", msg_id, subject, target)
                try:
                    r = await client.publish(
                        subject, f"{msg_id}|chaos".encode(), {"msg_id": msg_id}, timeout=5.0
                    )
                except mc.PublishOutcomeUnknown as exc:
                    self.stats["info"] += 1
                    self._record_publish(name, "info", msg_id, subject, target, reason=str(exc))
                except mc.NotConnectedError as exc:
                    self.stats["fail"] += 1
                    reason = f"not sent: {exc}"
                    self._record_publish(name, "fail", msg_id, subject, target, reason=reason)
                else:
                    if r.ok and r.position is not None:
                        self.stats["ok"] += 1
                        self.acked[subject].add(msg_id)
                        epoch, seq = r.position.epoch, r.position.seq
                        self._record_publish(
                            name, "ok", msg_id, subject, target, epoch=epoch, seq=seq
                        )
                    else:
                        self.stats["fail"] += 1
                        reason = f"{r.status}: {r.reason}"
                        self._record_publish(name, "fail", msg_id, subject, target, reason=reason)
                await trio.sleep(rng.expovariate(self.rate / self.n_pub))

    async def sdk_subscriber(self, k: int, ready: trio.Event) -> None:
        import migratory_client as mc

        name = f"s{k}"
        self.seen.setdefault(name, set())
        policy = mc.ReconnectPolicy(initial_delay=0.05, max_delay=0.5, connect_timeout=2.0)
        prefer = (k + 1) % self.n
        async with mc.connect(
            self.servers_for(prefer),
            name=name,
            reconnect=policy,
            keepalive=mc.Keepalive(interval=1.0, timeout=2.0),
            rng=random.Random(self.seed * 7919 + k),
        ) as client:

            async def notes() -> None:
                async for note in client.notifications():
                    pos = note.position
                    epoch, seq = (pos.epoch, pos.seq) if pos else (None, None)
                    server = self.member_of(note.server or client.server)
                    subjects = [note.subject] if note.subject else [None]
                    for s in subjects:
                        event = str(note.status)
                        self._record_subscription(name, "sdk", s, event, server, epoch, seq)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(notes)
                async with client.subscribe(*SUBJECTS) as sub:
                    for s in SUBJECTS:
                        self._record_subscription(name, "sdk", s, "subscribed", None)
                    ready.set()
                    async for m in sub:
                        self.stats["deliveries"] += 1
                        self._record_delivery(name, "sdk", self.member_of(client.server), m)
                nursery.cancel_scope.cancel()

    async def raw_auditor(self, k: int, ready: trio.Event) -> None:
        """Protocol-level subscriber: resume by last position seen, no dedupe, no gap repair."""
        from chaos.rawtrio import RawSession
        from migratory.protocol import ops

        name = f"a{k}"
        self.seen[name] = set()
        last: dict[str, tuple[int, int]] = {}
        idx = (self.n - 1 - k) % self.n
        attempts = 0
        while attempts < 100_000:
            attempts += 1
            url = self.client_urls[idx]
            mname = member(idx)
            port = int(url.rsplit(":", 1)[1])
            try:
                with trio.fail_after(3):
                    session = await RawSession.open(port, name)
            except Exception:  # refused, 1013 while syncing, paused member, ...
                idx = (idx + 1) % self.n
                await trio.sleep(0.1)
                continue
            self._record_subscription(name, "raw", None, "SERVER_UP", mname)
            reason = "closed"
            try:
                async with session:
                    await session.subscribe([(s, last.get(s)) for s in SUBJECTS])
                    for s in SUBJECTS:
                        e, q = last.get(s, (None, None))
                        self._record_subscription(name, "raw", s, "subscribed", mname, e, q)
                    ready.set()
                    async for op in session.ops(ping_every=1.0, pong_timeout=2.0):
                        if isinstance(op, ops.Deliver):
                            for m in op.messages:
                                # resume from the highest seq seen in the epoch: a late
                                # (reordered) message must not move the auditor back
                                seen = last.get(m.subject)
                                if seen is None or seen[0] != m.epoch or m.seq > seen[1]:
                                    last[m.subject] = (m.epoch, m.seq)
                                self._record_delivery(name, "raw", mname, m)
                        elif isinstance(op, ops.SubjectStatus):
                            pos = op.position
                            if op.status.value == "DATA_RESYNC" and pos is not None:
                                last[op.subject] = (pos.epoch, pos.seq)
                            e, q = (pos.epoch, pos.seq) if pos else (None, None)
                            event = op.status.value
                            self._record_subscription(name, "raw", op.subject, event, mname, e, q)
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
            self._record_subscription(name, "raw", None, "SERVER_DOWN", mname)
            self.say(f"auditor {name} lost {mname} ({reason[:80]})")
            idx = (idx + 1) % self.n
            await trio.sleep(0.1)
