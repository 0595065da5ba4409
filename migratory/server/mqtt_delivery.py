"""The delivery side of an MQTT session: messages the hub fans out, snapshots for a new
subscription, QoS 1 in flight, and the position reached on each subject (what keeps a
message from being delivered twice, and what a persistent session saves). A base of
:class:`~migratory.server.mqtt_session.MqttSession` (after the input side), kept apart so
that each file reads alone; the fan-out path stays plain attribute and dict reads
(``benchmarks/mqtt_fanout_cpu.py``)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from itertools import islice
from typing import TYPE_CHECKING

from migratory import client_lines
from migratory.model.message import Message, Qos
from migratory.model.outbox import Outbox, SlowConsumer
from migratory.model.position import Position
from migratory.protocol import mqtt_encode
from migratory.server.format_sink import MissedRun, Run
from migratory.server.mqtt_backlog import Backlog
from migratory.server.mqtt_frames import SHARED
from migratory.server.mqtt_inflight import Inflight
from migratory.server.mqtt_input import MqttInput
from migratory.server.mqtt_store import SessionRecord
from migratory.server.mqtt_subscriptions import Subscriptions
from migratory.server.run_output import queue_run
from migratory.server.session_subscriptions import SLICE_UNITS

if TYPE_CHECKING:
    from migratory.server.context import ServerContext
    from migratory.server.session_link import Link

log = logging.getLogger("migratory.mqtt")

PRUNE_FROM = 1024
"""Subjects a session's positions reach before it first forgets those the hub forgot
(:meth:`MqttDelivery.settle_reached`); then again each time they have doubled."""
DROP_SLACK = 16
"""Past MqttSessionMaxSubjects a session drops a sixteenth of the bound more than it must
(:meth:`MqttDelivery.bound_positions`): the next drop comes that many subjects later, and
the positions stay a plain ``dict`` (an ``OrderedDict``, whose front can be dropped one
at a time, made each delivery of another subject ~20 % dearer, mqtt_fanout_cpu.py; a
``dict`` dropped one at a time from its front costs 3.8 us at 10,000, the holes)."""


_QOS0_RUN = "mqtt-qos0-run"  # a MissedRun's: its messages one lineage, seq increasing
_GUARANTEED = "mqtt-guaranteed"  # ... some of them QoS 1 where granted


def _qos0_run(messages: Sequence[Message]) -> bool:
    epoch, seq = messages[0].epoch, messages[0].seq
    return all(m.epoch == epoch and m.seq == seq + n for n, m in enumerate(messages))


def _guaranteed(messages: Sequence[Message]) -> bool:
    return any(m.qos is Qos.GUARANTEED for m in messages)


class _LastSettled:
    """The position of the last message a session settled, shared by the sessions that
    settle it next: a fan-out hands one message to every session in turn, and each
    settles it at its next delivery of another subject -- one Position for all of them
    (building one per session cost a '#' subscriber ~0.3 us of its ~0.5 us per
    delivery when each delivery is of another subject)."""

    __slots__ = ("message", "position")

    def __init__(self) -> None:
        self.message: Message | None = None
        self.position = Position(0, 0)


_SETTLED = _LastSettled()


class MqttDelivery(MqttInput):
    # the last delivery's, when to forget subjects, how many to keep, and the subjects
    # delivered live while a SUBSCRIBE's retained messages go out; the rest are
    # MqttSession's
    __slots__ = (
        "_backlog", "_forget_at", "_hot", "_hot_subject", "_live_meanwhile",
        "_max_positions", "_prune_at",
    )
    _backlog: Backlog | None  # a cache sync's jump at QoS 1, and what came after it
    _ctx: ServerContext
    _forget_at: int
    _hot: Message | Position | None
    _hot_subject: str | None
    _live_meanwhile: set[str] | None
    _max_positions: int
    _prune_at: int
    _reached: dict[str, Position | Message]
    _record: SessionRecord | None
    _inflight: Inflight
    _link: Link
    outbox: Outbox
    subscriptions: Subscriptions
    websocket: bool

    def _changed(self, *, positions: bool = False) -> None:
        raise NotImplementedError

    def _wrap(self, packet: bytes) -> bytes:
        raise NotImplementedError

    def _deliver(self, frame: bytes) -> bool:
        raise NotImplementedError

    def _slow_consumer(self, why: str) -> None:
        raise NotImplementedError

    def settle_reached(self) -> dict[str, Position | Message]:
        """The position reached on each subject, whole: the last delivery's subject is kept
        apart by ``deliver_message`` (one subject's deliveries then touch no dictionary,
        and the message stands for its position until then); anything else that reads or
        writes the positions settles it first, as a Position: kept, the message held its
        content after the hub dropped it (expired, or forgotten with its subject) -- a
        session's last message of every subject, up to PRUNE_FROM of them and more
        between prunes: 1 GB for 1,024 subjects of 1 MB messages. A session now holds
        ~100 bytes per subject whatever its messages' size, plus the one message here,
        for at most MqttSessionMaxSubjects subjects (:meth:`bound_positions`)."""
        subject = self._hot_subject
        if subject is not None:
            hot = self._hot
            if hot is not None:
                if isinstance(hot, Message):  # its position (_LastSettled), inlined
                    settled = _SETTLED
                    if settled.message is not hot:
                        settled.message = hot
                        settled.position = hot.position
                    hot = settled.position
                self._reached[subject] = hot
            self._hot_subject = self._hot = None
        if len(self._reached) > self._prune_at:  # (also after a write of another caller)
            self.bound_positions()
        return self._reached

    def bound_positions(self) -> None:
        """Forget the subjects the hub forgot (once the positions have doubled since the
        last time), then the positions held first past MqttSessionMaxSubjects: a clean '#'
        session over 1,000,000 live subjects held one for each (~88 B: 88 MB per
        session, ``benchmarks/mqtt_session_positions.py``). Nothing is lost with one: the
        hub gives a session each live message once, in order, whatever filters match; a
        position only keeps a message from coming twice where two paths deliver it (a
        resume's catch-up and live messages: never dropped while one goes on, a subject
        caught up and dropped would be caught up again) and, persistent, is what the
        record saves (bounded by the same key, ``mqtt_store``). Counted in
        ``mqtt_positions_dropped``."""
        reached = self._reached
        if len(reached) > self._forget_at:
            self._forget_forgotten_subjects()
        resuming = self.subscriptions.resuming
        bound = self._max_positions
        if len(reached) > bound and not resuming:
            over = len(reached) - bound + bound // DROP_SLACK
            for subject in list(islice(reached, over)):  # the oldest first
                del reached[subject]
            self._ctx.stats.mqtt_positions_dropped += over
        self._prune_at = self._forget_at if resuming else min(
            self._forget_at, self._max_positions)

    def _forget_forgotten_subjects(self) -> None:
        """Drop the positions of the subjects the hub has forgotten (spent one-off subjects,
        :meth:`Hub.expire`): a wildcard session over days of new subjects kept each one's
        last message, and a persistent one its position in every save of its record. Such
        a subject, if it comes back, starts a new epoch: no position of it was of use.
        Amortised: once the positions have doubled since the last time."""
        known = self._ctx.hub.position
        reached = self._reached
        for subject in [s for s in reached if known(s) is None]:
            del reached[subject]
        record = self._record
        if record is not None:
            for subject in [s for s in record.positions if known(s) is None]:
                record.forget(subject)
        self._forget_at = max(PRUNE_FROM, 2 * len(reached))

    def note_position(self, subject: str, position: Position) -> None:
        """Where a new subscription of ``subject`` starts."""
        if position.epoch:
            self.settle_reached()[subject] = position
        if self._record is not None:
            self._record.set_position(subject, position)

    def synced(self, subject: str) -> None:
        """A resume of ``subject`` from its recorded position gets every missed message."""
        stats = self._ctx.stats
        stats.count(stats.resumes, "sync")

    def resynced(self, subject: str, *, quiet: bool = False, unsent: bool = False) -> None:
        """A resume could not tell what was missed on ``subject``: the snapshot follows
        (``quiet``: counted, not logged; ``unsent``: the subject has none, so the empty
        RETAIN of :meth:`deliver_reset` follows -- said so in the line: three chaos runs'
        MQTT losses were such resyncs, logged as if a snapshot had gone out, and nothing
        was sent)."""
        stats = self._ctx.stats
        stats.mqtt_resyncs += 1
        stats.count(stats.resumes, "resync")
        if not quiet:
            log.warning("%s: %s resumed from its snapshot (the cache no longer reaches "
                        "back)%s", self.describe(), subject,
                        ": it has none, an empty RETAIN sent (reset, no snapshot)"
                        if unsent else "", extra=self.log_fields())

    def resync(self, subject: str, position: Position, snapshot: Message | None,
               qos: int) -> None:
        """A live ``subject`` jumped to ``position`` further than the cache reaches (a
        cluster member's cache sync): told as a resume's resync (docs/mqtt.md) -- its
        snapshot with RETAIN, counted in ``mqtt_resyncs``, logged (rate-limited: one sync
        may move every subject of a '#' session). Without a snapshot (or an empty one):
        an empty RETAIN (:meth:`deliver_reset`). Before, the snapshot came as a plain
        live PUBLISH, or nothing; then nothing without a snapshot, counted and logged
        only: the client never told."""
        if self.closing or self.aborted or self._held(
                functools.partial(self.resync, subject, position, snapshot, qos)):
            return
        stats = self._ctx.stats
        stats.mqtt_resyncs += 1
        client_lines.lines.log(
            log, logging.WARNING, "mqtt live resync",
            "%s: %s moved past what the cache holds (a cache sync, to seq %d): %s",
            self.describe(), subject, position.seq,
            "its snapshot sent" if snapshot is not None and snapshot.content
            else "no snapshot: an empty RETAIN sent (reset)", extra=self.log_fields())
        if snapshot is not None and snapshot.content:
            self.deliver_retained(snapshot, qos, position)
        else:
            self.deliver_reset(subject, position, qos)

    def deliver_message(self, message: Message, qos: int) -> None:
        """A live or recovered message of a subscribed subject (the hub calls this for
        every subscriber: the fan-out path, kept to plain dict and attribute reads, with
        the queueing inlined -- ``benchmarks/mqtt_fanout_cpu.py``)."""
        if self.closing or self.aborted:
            return
        backlog = self._backlog
        if backlog is not None and not backlog.draining:  # behind a jump (mqtt_backlog)
            self._held(functools.partial(self.deliver_message, message, qos),
                       len(message.content))
            return
        subject = message.subject
        if subject == self._hot_subject:  # the usual case: no dictionary to touch
            last = self._hot
        else:
            last = self.settle_reached().get(subject)
            self._hot_subject = subject
            self._hot = last
            meanwhile = self._live_meanwhile  # (None but while retained messages go out)
            if meanwhile is not None:
                meanwhile.add(subject)
        # seq first: a live message is always past ``last``, so one comparison decides
        if last is not None and message.seq <= last.seq and last.epoch == message.epoch:
            return  # already delivered (two filters match, or a recovery overlap)
        self._hot = message
        if qos and message.qos is Qos.GUARANTEED:
            self._deliver_qos1(message, retain=False)
            return
        shared = SHARED
        if shared.message is message and not self.websocket:
            frame = shared.plain
        else:
            frame = shared.qos0(message, self.websocket)
        try:  # _deliver, inlined
            full = self.outbox.enqueue(frame)
        except SlowConsumer as exc:
            self._slow_consumer(str(exc))
            return
        if full:
            self._link.flush_now()
        else:
            self._link.mark_dirty()
        if self._record is not None and not self._inflight.outstanding(subject):
            # (a QoS 1 message of the subject still unacknowledged keeps it where it is)
            self._record.set_position(subject, message.position)
            self._changed(positions=True)

    def deliver_missed(self, missed: MissedRun, qos: int) -> bool:
        """The messages of one subject a cluster member's cache sync jumped over, oldest
        first (the hub's call, ``Hub._catch_up_live``): what :meth:`deliver_message` of
        each does. At QoS 0 the session queues them as runs of the shared PUBLISHes,
        joined once for every session (``run_output.queue_run``), and a persistent one
        moves its record once a run, to the last message taken (each delivery moved it
        to its own message: the same record in the end, cut off or not); before, each
        session encoded each one again (the shared frame is the last message's: 1.35 us
        a delivery, docs/benchmarks.md). At QoS 1 (a packet identifier each: nothing
        to share) they wait in the session's :class:`Backlog`, delivered one at a time
        in the session's own turns of the loop (:meth:`refill`), not in the hub's step.
        A session that has some of them already, or a backlog already: False, nothing
        sent -- ``format_sink.tell_missed`` gives them one at a time."""
        messages = missed.messages
        if not messages or self.closing or self.aborted:
            return True
        if self._backlog is not None:
            return False  # (one at a time: behind it, in order)
        if qos and missed.shared(_GUARANTEED, lambda: _guaranteed(messages)):
            self._backlog = Backlog(messages, qos, self.deliver_message)
            self._link.mark_dirty()  # its writer drains it (refill), or its reader
            return True
        first = messages[0]
        subject = first.subject
        hot = subject == self._hot_subject
        last = self._hot if hot else self.settle_reached().get(subject)
        if ((last is not None and last.epoch == first.epoch and first.seq <= last.seq)
                or not missed.shared(_QOS0_RUN, lambda: _qos0_run(messages))):
            return False
        if subject != self._hot_subject:  # (deliver_message's, once)
            self._hot_subject = subject
            meanwhile = self._live_meanwhile
            if meanwhile is not None:
                meanwhile.add(subject)
        self._hot = messages[-1]
        websocket = self.websocket
        taken = [0]  # bytes of the run the outbox took

        def deliver(frame: bytes) -> None:
            if not (self.closing or self.aborted) and self._deliver(frame):
                taken[0] += len(frame)

        for run in missed.runs((_QOS0_RUN, websocket),
                               lambda message, _: SHARED.qos0(message, websocket)):
            taken[0] = 0
            queue_run(self.outbox, self._link, deliver, run.joined, run.frames)
            if self._record is not None and taken[0]:
                self._recorded(run, taken[0])
            if self.closing or self.aborted:
                break
        return True

    def _recorded(self, run: Run, taken: int) -> None:
        """A persistent session's record moves to the last message of ``run`` the outbox
        took (``taken`` bytes of it: whole frames), as deliver_message's did with each."""
        record = self._record
        subject = run.last.subject
        if record is None or self._inflight.outstanding(subject):
            return  # (a QoS 1 message of it still unacknowledged keeps it where it is)
        last = run.last
        if taken < len(run.joined):  # cut off: the frames after ``taken`` were refused
            ends, left = 0, 0
            for frame in run.frames:
                ends += len(frame)
                if ends > taken:
                    left += 1
            last_seq = last.seq - left  # (the run's messages: one lineage, seq + 1 each)
            record.set_position(subject, Position(last.epoch, last_seq))
        else:
            record.set_position(subject, last.position)
        self._changed(positions=True)

    def watch_live(self, on: bool) -> set[str] | None:
        """While a SUBSCRIBE's retained messages go out (``on``): the subjects delivered
        live from now on, so that none gets an older retained message after a live one
        (a copy of every position held, as it was, cost 0.3 GB per '#' SUBSCRIBE at
        1,000,000 subjects). The last delivery is settled: the next delivery of every
        subject goes through the note."""
        self.settle_reached()
        self._live_meanwhile = set() if on else None
        return self._live_meanwhile

    def deliver_retained(self, message: Message, qos: int,
                         position: Position | None = None) -> None:
        """A snapshot sent because of a new subscription, or of a resync: RETAIN set.
        ``position`` (a resync): where the subject is now -- the session carries on from
        there, as a native client does from its ``DATA_RESYNC``'s position, and so does its
        record once a QoS 1 snapshot is acknowledged. Before, both stayed at the
        snapshot's own seq: a later resume sent the non-retained messages cached between
        it and the subject's position (on another connection, late), or not, whether a
        live message had come first."""
        if self.closing or self.aborted or not message.content:
            return  # an empty retained message deletes it, for MQTT clients
        if self._held(functools.partial(self.deliver_retained, message, qos, position),
                      len(message.content)):
            return
        self.subscriptions.take(message)
        at = message.position
        if position is not None and position.seq and (
                position.epoch != message.epoch or position.seq > message.seq):
            self.settle_reached()[message.subject] = at = position
        if qos and message.qos is Qos.GUARANTEED:
            self._deliver_qos1(message, retain=True, at=at)
        else:
            frame = mqtt_encode.encode_publish(message.subject[1:], message.content, retain=True)
            self._deliver(self._wrap(frame))

    def deliver_reset(self, subject: str, position: Position | None, qos: int) -> None:
        """A resync of ``subject`` with no snapshot to send: a PUBLISH with RETAIN set and
        an empty payload -- in MQTT, "no retained value" -- at the granted ``qos``: the
        client's state of the topic is reset, there is no snapshot (docs/mqtt.md). Before,
        nothing was sent and the client silently missed what the cache no longer held.
        ``position``: where the subject is now (None: not known here); the session's
        position moves there as a snapshot's would (:meth:`Subscriptions.take`) and, at
        QoS 1, the record's once the client acknowledges it."""
        if self.closing or self.aborted or self._held(
                functools.partial(self.deliver_reset, subject, position, qos)):
            return
        reached = self.settle_reached()
        held = reached.get(subject)
        if position is not None and position.seq and (
                held is None or held.epoch != position.epoch or position.seq > held.seq):
            reached[subject] = held = position
        if not qos:
            self._deliver(self._wrap(mqtt_encode.encode_publish(subject[1:], b"", retain=True)))
            return
        refusal = self._inflight.full()
        if refusal is not None:
            self._slow_consumer(refusal)
            return
        at = Position(0, 0) if held is None else Position(held.epoch, held.seq)
        packet_id = self._inflight.add(subject, at)
        self._deliver(self._wrap(mqtt_encode.encode_publish(
            subject[1:], b"", qos=1, retain=True, packet_id=packet_id)))

    # --- behind a cache sync's jump at QoS 1 (mqtt_backlog) -----------------------

    def _held(self, delivery: Callable[[], None], size: int = 0) -> bool:
        """Whether ``delivery`` waits behind a jump (then held, in order): past
        ClientMaxPendingBytes with what the outbox holds, a slow consumer, as if queued."""
        backlog = self._backlog
        if backlog is None or backlog.draining:
            return False
        backlog.hold(delivery, size)
        outbox = self.outbox
        if outbox.pending_bytes + backlog.held_bytes > outbox.max_pending:
            self._slow_consumer(
                f"{backlog.held_bytes} bytes of messages wait behind a cache sync's jump, "
                f"{outbox.pending_bytes} queued, ClientMaxPendingBytes {outbox.max_pending}")
        return True

    @property
    def refilling(self) -> bool:
        """A jump's backlog waits, the session not closing: its writer refills
        it in its turns of the loop, as the socket drains."""
        return self._backlog is not None and not (self.closing or self.aborted)

    def refill(self, budget: int | None = None, now: float = 0.0) -> bool:
        """Deliver the next of the backlog, about ``budget`` units of work (counted in
        ``work_done``); True while more waits."""
        backlog = self._backlog
        if backlog is None or self.closing or self.aborted:
            self._backlog = None  # (closed: what it held goes with it)
            return False
        self.work_done += backlog.drain(SLICE_UNITS if budget is None else budget,
                                        lambda: self.closing or self.aborted)
        if not backlog:
            self._backlog = None
        return self.refilling

    def _deliver_qos1(self, message: Message, *, retain: bool,
                      at: Position | None = None) -> None:
        refusal = self._inflight.full()
        if refusal is not None:
            self._slow_consumer(refusal)
            return
        packet_id = self._inflight.add(message.subject, message.position if at is None else at)
        frame = mqtt_encode.encode_publish_from_parts(
            SHARED.topic_of(message.subject), message.content, qos=1, retain=retain,
            packet_id=packet_id
        )
        self._deliver(self._wrap(frame))

    def _on_puback(self, packet_id: int) -> None:
        delivered = self._inflight.acknowledge(packet_id)
        if delivered is None or self._record is None:
            return
        subject, position = delivered
        if position is not None:  # (None: an earlier delivery of it is not acknowledged)
            self._record.set_position(subject, position)
            self._changed(positions=True)
