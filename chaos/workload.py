"""The recorded workload: its shared state and history rows, and the SDK clients.

Every publish (invoke / ok / fail / info), delivery and subscription event goes to
the history. A publish's content is ``"<msg_id>|chaos"`` so that any subscriber can
tell which publish it received (:func:`parse_id`). Publishers offer Poisson arrivals
(open loop: a publish does not wait for the previous one's acknowledgement); the raw
clients are in :mod:`chaos.raw_workload`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from chaos.history import History
from chaos.plan import PublisherPlan, SubscriberPlan, WorkloadPlan
from chaos.schedule import member

if TYPE_CHECKING:
    from migratory.model.message import Message

PUBLISH_TIMEOUT = 5.0  # seconds a publisher waits for its status before "outcome unknown"
# Standard: a drain waits this long after the last delivery, for a forward still on its
# way after a DATA_RESYNC that made it stop waiting for that message (Workload.drained)
SETTLE = 1.0
MAX_IN_FLIGHT = 2_000  # publishes one publisher has sent and not heard back about
LATE = 1.0  # s behind its schedule after which a publisher drops arrivals (counted)
ACK_MARGIN = 0.1  # s: a publish invoked this long after a seed majority is lost cannot commit


def parse_id(content: bytes) -> str | None:
    """The msg_id of a publish of this workload, None for any other content."""
    text = content.decode("utf-8", "replace")
    head, sep, tail = text.partition("|")
    return head if sep and tail == "chaos" and head.startswith("p") else None


class Arrivals:
    """One publisher's seeded choices: when the next publish comes and what it is.

    Open loop: arrival times are a Poisson process of their own; an arrival the
    publisher reaches more than :data:`LATE` s after its time is dropped and counted in
    ``late`` (the load generator could not keep up: a figure to watch, not a fault)."""

    def __init__(self, seed: int, plan: WorkloadPlan, publisher: PublisherPlan) -> None:
        self.rng = random.Random(f"{seed}-{publisher.name}")
        self.times = random.Random(f"{seed}-{publisher.name}-times")
        self.plan, self.publisher, self.n = plan, publisher, 0
        self.at: float | None = None
        self.late = 0

    def due(self, now: float) -> float:
        """The (trio) time of the next arrival, at least ``now - LATE``."""
        at = now if self.at is None else self.at
        at += self.times.expovariate(self.publisher.rate)
        while at < now - LATE:
            self.late += 1
            at += self.times.expovariate(self.publisher.rate)
        self.at = at
        return at

    def next(self) -> tuple[str, str, bytes, dict[str, str], bool, bool]:
        """(msg_id, subject, content, fields, retained, guaranteed qos)."""
        self.n += 1
        rng = self.rng
        msg_id = f"{self.publisher.name}-{self.n}"
        fields = {"msg_id": msg_id}
        if rng.random() < self.plan.fields_share:
            fields |= {"price": f"{rng.uniform(1, 500):.2f}", "seq": str(self.n)}
        subject = rng.choice(self.plan.subjects)
        retained = rng.random() < self.plan.retained_share
        return msg_id, subject, f"{msg_id}|chaos".encode(), fields, retained, rng.random() < 0.5


def starts_anew(event: str, subject: str | None, epoch: int | None) -> bool:
    """A status after which a Standard subscriber is owed only what is invoked later: a
    ``DATA_RESYNC`` (it may have announced what came before lost), or a fresh subscribe's
    ``SUBSCRIBE_ALLOW`` with a position (e.g. an SDK subscriber's first, when it came
    long after it asked)."""
    return subject is not None and (
        event == "DATA_RESYNC" or (event == "SUBSCRIBE_ALLOW" and epoch is not None))


class Workload:
    def __init__(
        self,
        *,
        seed: int,
        plan: WorkloadPlan,
        client_urls: list[str],
        history: History,
        say: Callable[[str], None],
        standard: bool = False,
    ) -> None:
        """``client_urls[i]`` reaches member i; ``standard``: a Standard cluster's (the
        drain does not wait for what a ``DATA_RESYNC`` announced: :meth:`drained`)."""
        self.seed, self.plan, self.client_urls, self.h, self.say = (
            seed, plan, client_urls, history, say
        )
        self.n = len(client_urls)
        self.url_to_member = {url: member(i) for i, url in enumerate(client_urls)}
        # subject -> [(invoke time, msg_id)] of acknowledged publishes
        self.acked: dict[str, list[tuple[float, str]]] = {s: [] for s in plan.subjects}
        self.standard: set[str] = set()  # msg_ids published standard (MQTT QoS 0)
        self.seen: dict[str, set[str]] = {}  # subscriber -> msg_ids delivered to it
        self.subscribed_at: dict[str, float] = {}  # subscriber -> first subscribe time
        self.standard_mode = standard
        # (subscriber, subject) -> the last status it started anew at (Standard's drain)
        self.resynced: dict[tuple[str, str], float] = {}
        self.last_delivery = -SETTLE
        self.stats = {"ok": 0, "fail": 0, "info": 0, "deliveries": 0, "invoke": 0}
        self.invoked: list[float] = []  # times of the invoke rows
        self.ack_times: list[tuple[float, float]] = []  # (invoke, ack) times of the ok rows
        self.publishing = True
        self._arrivals: dict[str, Arrivals] = {}
        self.started: float | None = None  # trio time publishing started

    def arrivals(self, spec: PublisherPlan) -> Arrivals:
        """The publisher's arrivals, one for the whole run (a restarted publisher goes on
        numbering its msg_ids where it stopped)."""
        return self._arrivals.setdefault(spec.name, Arrivals(self.seed, self.plan, spec))

    @property
    def late(self) -> int:
        """Arrivals dropped because a publisher was more than LATE s behind its schedule."""
        return sum(a.late for a in self._arrivals.values())

    def member_of(self, url: str | None) -> str | None:
        return self.url_to_member.get(url or "", url)

    def servers_for(self, prefer: int) -> list[str]:
        return [f"{100 if i == prefer else 10} {u}" for i, u in enumerate(self.client_urls)]

    def drained(self) -> bool:
        """Every acknowledged publish invoked after a subscriber subscribed has reached it
        -- in Standard, every one invoked after its last ``DATA_RESYNC`` of the subject
        (or fresh ``SUBSCRIBE_ALLOW``: :func:`starts_anew`): one before it may have been
        announced lost (a forward gap, a failover), as the checker holds it
        (spark_analysis/standard.py); waiting for it ended every Standard drain at its
        5 s without a delivery, ``drained=False``. And not within
        :data:`SETTLE` s of the last delivery (a message invoked before such a resync may
        still come: the checker then counts it)."""
        if self.standard_mode and self.h.now() - self.last_delivery < SETTLE:
            return False
        for sub in self.plan.subscribers:
            since = self.subscribed_at.get(sub.name)
            if since is None:
                continue
            seen = self.seen.get(sub.name, set())
            # MQTT delivers standard messages at QoS 0: at most once
            skip = self.standard if sub.kind == "mqtt" else set()
            for subject in sub.subjects:
                start = max(since, self.resynced.get((sub.name, subject), since)) \
                    if self.standard_mode else since
                if any(
                    t > start and m not in seen and m not in skip for t, m in self.acked[subject]
                ):
                    return False
        return True

    def majority_loss(self, windows: list[tuple[float, float, str]]) -> list[dict[str, Any]]:
        """Per window without a seed majority: the publishes invoked in it, and how many of
        those (invoked :data:`ACK_MARGIN` s or more after it began) were acknowledged before
        it ended: none can have been committed, so any is a false OK."""
        out = []
        for lo, hi, what in windows:
            invoked = sum(lo < t < hi for t in self.invoked)
            acked = sum(lo + ACK_MARGIN < t and a < hi for t, a in self.ack_times)
            out.append({"from": round(lo, 3), "to": round(hi, 3), "what": what,
                        "invoked": invoked, "acknowledged_inside": acked})
        return out

    # --- history -----------------------------------------------------------------------

    def record_publish(
        self,
        publisher: str,
        event: str,
        msg_id: str,
        subject: str,
        target: str | None,
        invoked: float | None = None,
        **result: Any,
    ) -> None:
        """A ``publishes`` line: ``event`` is invoke | ok | fail | info; ``result`` holds
        epoch and seq (ok) or the reason (fail, info), or the qos (invoke: guaranteed |
        standard); ``invoked`` the invoke time (ok)."""
        self.stats[event] += 1
        if event == "invoke":
            self.invoked.append(self.h.now())
            if result.get("qos") == "standard":
                self.standard.add(msg_id)
        if event == "ok" and invoked is not None:
            self.ack_times.append((invoked, self.h.now()))
            self.acked[subject].append((invoked, msg_id))
        self.h.write(
            "publishes",
            publisher=publisher,
            type=event,
            msg_id=msg_id,
            subject=subject,
            member=target,
            **result,
        )

    def record_subscription(
        self,
        subscriber: str,
        kind: str,
        subject: str | None,
        event: str,
        member_name: str | None,
        epoch: int | None = None,
        seq: int | None = None,
    ) -> None:
        if event == "subscribed":
            self.subscribed_at.setdefault(subscriber, self.h.now())
        elif starts_anew(event, subject, epoch):
            self.resynced[(subscriber, str(subject))] = self.h.now()
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

    def record_delivery(
        self, subscriber: str, kind: str, member_name: str | None, message: Message
    ) -> None:
        msg_id = parse_id(message.content)
        if msg_id:
            self.seen[subscriber].add(msg_id)
        self.stats["deliveries"] += 1
        self.last_delivery = self.h.now()
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
        """The end of the run: every subscriber unsubscribes from each of its subjects."""
        for sub in self.plan.subscribers:
            if sub.name in self.subscribed_at:
                for s in sub.subjects:
                    self.record_subscription(sub.name, sub.kind, s, "unsubscribed", None)

    # --- SDK tasks ---------------------------------------------------------------------

    async def sdk_publisher(self, spec: PublisherPlan) -> None:
        import migratory_client as mc

        arrivals = self.arrivals(spec)
        policy = mc.ReconnectPolicy(initial_delay=0.05, max_delay=0.5, connect_timeout=2.0)
        in_flight = [0]

        async def publish_one(client: mc.Client, arrival: tuple[Any, ...], target: Any) -> None:
            msg_id, subject, content, fields, retained, guaranteed = arrival
            qos = mc.Qos.GUARANTEED if guaranteed else mc.Qos.STANDARD
            invoked = self.h.now()
            in_flight[0] += 1
            try:
                r = await client.publish(
                    subject, content, fields, retained=retained, qos=qos, timeout=PUBLISH_TIMEOUT
                )
            except mc.PublishOutcomeUnknown as exc:
                self.record_publish(spec.name, "info", msg_id, subject, target, reason=str(exc))
            except mc.NotConnectedError as exc:
                reason = f"not sent: {exc}"
                self.record_publish(spec.name, "fail", msg_id, subject, target, reason=reason)
            except trio.Cancelled:
                reason = "no status before the run ended"
                self.record_publish(spec.name, "info", msg_id, subject, target, reason=reason)
                raise
            else:
                if r.ok and r.position is not None:
                    pos = r.position
                    self.record_publish(
                        spec.name, "ok", msg_id, subject, target, invoked,
                        epoch=pos.epoch, seq=pos.seq,
                    )
                else:
                    reason = f"{r.status}: {r.reason}"
                    self.record_publish(spec.name, "fail", msg_id, subject, target, reason=reason)
            finally:
                in_flight[0] -= 1

        async with mc.connect(
            self.servers_for(spec.prefer),
            name=spec.name,
            reconnect=policy,
            keepalive=mc.Keepalive(interval=1.0, timeout=2.0),
            rng=random.Random(arrivals.rng.random()),
        ) as client, trio.open_nursery() as nursery:

            async def sessions() -> None:  # progress lines only (not a subscriber's history)
                async for note in client.notifications():
                    if note.status in (mc.NotificationStatus.SERVER_UP,
                                       mc.NotificationStatus.SERVER_DOWN):
                        where = self.member_of(note.server)
                        why = note.reason or ""
                        self.say(f"publisher {spec.name}: {note.status} {where} {why}")

            nursery.start_soon(sessions)
            while self.publishing:
                await trio.sleep_until(arrivals.due(trio.current_time()))
                arrival = arrivals.next()
                target = self.member_of(client.server)
                qos = "guaranteed" if arrival[5] else "standard"
                self.record_publish(spec.name, "invoke", arrival[0], arrival[1], target, qos=qos)
                if in_flight[0] >= MAX_IN_FLIGHT:
                    reason = f"not sent: {in_flight[0]} publishes in flight"
                    self.record_publish(spec.name, "fail", arrival[0], arrival[1], target,
                                        reason=reason)
                    continue
                nursery.start_soon(publish_one, client, arrival, target)
            with trio.move_on_after(PUBLISH_TIMEOUT + 1):
                while in_flight[0]:
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()

    async def sdk_subscriber(self, spec: SubscriberPlan, ready: trio.Event) -> None:
        import migratory_client as mc

        name = spec.name
        self.seen.setdefault(name, set())
        policy = mc.ReconnectPolicy(initial_delay=0.05, max_delay=0.5, connect_timeout=2.0)
        async with mc.connect(
            self.servers_for(spec.prefer),
            name=name,
            reconnect=policy,
            keepalive=mc.Keepalive(interval=1.0, timeout=2.0),
            rng=random.Random(f"{self.seed}-{name}"),
        ) as client:

            queue = client.notifications()

            def note(n: mc.Notification) -> None:
                pos = n.position
                epoch, seq = (pos.epoch, pos.seq) if pos else (None, None)
                server = self.member_of(n.server or client.server)
                self.record_subscription(name, "sdk", n.subject, str(n.status), server, epoch, seq)

            async def notes() -> None:
                async for n in queue:
                    note(n)

            # The SDK hands notifications and messages over in two queues, in the order
            # they came off the wire; a message is recorded only after every notification
            # that came before it (taken here if the notes task has not yet: a DATA_RESYNC
            # recorded after the next live message would make the Spark checker count the
            # messages it skipped as lost).
            async with trio.open_nursery() as nursery:
                nursery.start_soon(notes)
                async with client.subscribe(*spec.subjects, history=spec.history) as sub:
                    for s in spec.subjects:
                        self.record_subscription(name, "sdk", s, "subscribed", None)
                    ready.set()
                    async for m in sub:
                        while queue.pending:
                            note(queue.get_nowait())
                        self.record_delivery(name, "sdk", self.member_of(client.server), m)
                nursery.cancel_scope.cancel()
