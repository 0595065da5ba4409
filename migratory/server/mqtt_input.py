"""The input side of an MQTT session: bytes (raw, or inside WebSocket frames) into
packets, at most a budget of packets per call, malformed input closing the connection.
A mixin of :class:`~migratory.server.mqtt_session.MqttSession`, kept apart so that each
file reads alone."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from migratory import client_lines
from migratory.entitlement_decisions import ClientIdentity, DecisionPending, deferred_decisions
from migratory.model.subject import reserved
from migratory.model.topic import InvalidTopicError, filter_levels, topic_to_subject
from migratory.protocol import close_codes, mqtt
from migratory.protocol import websocket as ws
from migratory.server.mqtt_connect import check_connect
from migratory.server.mqtt_resume import SCAN_UNIT
from migratory.server.mqtt_store import decode_record, session_subject
from migratory.server.mqtt_subscriptions import SCAN_SLICE
from migratory.server.session_subscriptions import SLICE_UNITS

if TYPE_CHECKING:
    from migratory.server.context import ServerContext
    from migratory.server.mqtt_subscriptions import Subscriptions

log = logging.getLogger("migratory.mqtt")


SLICE_OPERATIONS = 1 + SCAN_SLICE // SCAN_UNIT
"""What a slice of a SUBSCRIBE's retained messages or of a resume's catch-up counts for
in the turn (about: a subject's missed messages are delivered whole)."""

DISCARD_WAIT = 1.0
"""Seconds a connection waits for a clean CONNECT's discard before it looks again (it
waits on until the discard's outcome: :meth:`MqttSaving.discard_then_connack`)."""


READ_BARRIER_WAIT = 2.0
"""Seconds a CONNECT waits for its read barrier (:mod:`migratory.server.read_barrier`):
past it -- the sequencer or the seeds out of reach -- it is refused with CONNACK 3,
server unavailable, and the client tries again. Under the 1 s of silence after which a
worker or non-seed is not ready (a CONNECT then is refused at once) plus the 3 s after
which a member not ready sends its clients away (cluster/readiness.py SHED_AFTER): a
CONNECT held then was closed without CONNACK (with 5 s, by hand, the sequencer
SIGSTOPped)."""


def _valid_filter(name: str) -> bool:
    """Whether the SUBSCRIBE asks the entitlement of filter ``name`` (an invalid one is
    refused with 0x80 unasked): each filter of a SUBSCRIBE on its own -- one invalid
    filter ended the asking ahead of those after it, which the SUBSCRIBE then asked in
    the event loop, every client waiting for the plugin."""
    try:
        filter_levels(name)
    except InvalidTopicError:
        return False
    return True


class MqttInput:
    # the rest are MqttSession's
    __slots__ = ("_barrier", "_barrier_passed", "_barrier_until", "_connect_checked",
                 "_held_packet", "_now", "_work", "decision_pending", "work_done")
    _ctx: ServerContext
    identity: ClientIdentity | None
    peer: str
    decision_pending: DecisionPending | None  # (set in MqttSession.__init__)
    work_done: int  # packets handled so far, as counted against a budget (the same)
    @property
    def refilling(self) -> bool:
        raise NotImplementedError  # MqttDelivery: a cache sync's jump waits

    def refill(self, budget: int | None = None, now: float = 0.0) -> bool:
        raise NotImplementedError  # MqttDelivery
    _held_packet: mqtt.Packet | None
    _barrier: Future[bool] | None  # a CONNECT's read barrier, waited for
    _barrier_until: float  # time.monotonic() past which it is given up
    _barrier_passed: bool  # the CONNECT's read barrier is behind it (passed or failed)
    _discarding: Future[None] | None  # (mqtt_saving: a CONNACK held)
    _connect_checked: tuple[str, ClientIdentity] | None
    _decoder: mqtt.MqttDecoder
    _frames: ws.FrameDecoder | None
    subscriptions: Subscriptions
    closing: bool
    aborted: bool

    def _on_packet(self, packet: mqtt.Packet, now: float) -> None:
        raise NotImplementedError

    def _refused(self, reason: str) -> None:
        raise NotImplementedError

    def too_many_filters(self, packet: mqtt.Subscribe | mqtt.Unsubscribe) -> bool:
        """A SUBSCRIBE or UNSUBSCRIBE of more than MaxSubjectsPerSubscribe filters is
        refused (closed, counted in ``subscribes_refused``) before any is looked at; the
        decoder read no more than one past the limit (``MqttDecoder``'s max_filters).
        Before, an UNSUBSCRIBE had no bound: 95,000 filters in one 1 MiB packet held the
        loop 0.13 s, and a connection could send them back to back."""
        limit = self._ctx.config.max_subjects_per_subscribe
        if isinstance(packet, mqtt.Subscribe):
            kind, count = "SUBSCRIBE", len(packet.requests)
        else:
            kind, count = "UNSUBSCRIBE", len(packet.filters)
        if count <= limit:
            return False
        self._ctx.stats.subscribes_refused += 1
        self._refused(f"{kind} of more than MaxSubjectsPerSubscribe ({limit}) filters")
        return True

    def _caught_up(self) -> None:
        raise NotImplementedError

    def _send_frame(self, frame: bytes) -> None:
        raise NotImplementedError

    def close(self, code: int, reason: str) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def log_fields(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for incomplete packets (and WebSocket frames): IncompleteFrameBudget."""
        frames = 0 if self._frames is None else self._frames.buffered
        return self._decoder.buffered + frames

    def receive_data(self, data: bytes, now: float, budget: int | None = None) -> bool:
        """Take ``data`` and handle at most ``budget`` packets of it (None: all); True
        when complete packets are left for :meth:`process` (one client's flood waits
        for the others' turn)."""
        if self.closing or self.aborted:
            return False
        self._now = now
        try:
            if self._frames is None:
                self._decoder.receive_data(data)
            elif not self._unwrap(data):
                return False
        except ws.RemoteProtocolError as exc:
            self._protocol_error(f"WebSocket: {exc.reason}")
            return False
        return self.process(now, budget)

    def process(self, now: float, budget: int | None = None) -> bool:
        """Handle the packets already received, at most ``budget``; True if more wait."""
        self._now = now
        handled = 0
        scanned = 0  # visits of SUBSCRIBEs' retained messages in this turn
        try:
            while not (self.closing or self.aborted):
                if self._discarding is not None:  # a CONNACK waits for the discard:
                    # nothing read meanwhile (the connection waits for it, as for an
                    # entitlement's decision, then processes again)
                    self.decision_pending = DecisionPending(
                        self._discarding, time.monotonic() + DISCARD_WAIT)
                    return True
                barrier = self._barrier
                if barrier is not None and not barrier.done() and (
                        time.monotonic() < self._barrier_until):  # the CONNECT held
                    self.decision_pending = DecisionPending(barrier, self._barrier_until)
                    return True
                if budget is not None and handled >= budget:
                    return True
                if self.refilling:  # a cache sync's jump first: sent before any later
                    # packet is handled, as when the hub's step sent it (mqtt_backlog)
                    if budget is not None and handled and handled + SLICE_UNITS > budget:
                        return True
                    done = self.work_done
                    self.refill(SLICE_UNITS)
                    handled += self.work_done - done
                    continue
                if self.subscriptions.busy:  # retained messages, or a resume's catch-up
                    if budget is not None and (scanned >= SCAN_SLICE or (
                            handled and handled + SLICE_OPERATIONS > budget)):
                        # a slice per turn at most, and none that could pass the
                        # step's budget (a CONNECT let in with 2 reserved did 1 and a
                        # slice): the others' turn first
                        return True
                    self._work = self.subscriptions.work(
                        SCAN_SLICE if budget is None else SCAN_SLICE - scanned)
                    scanned += self._work
                    handled += 1 + self._work // SCAN_UNIT
                    self.work_done += 1 + self._work // SCAN_UNIT
                    if not self.subscriptions.busy:
                        self._caught_up()  # a SUBSCRIBE's SUBACK, a resume's save
                    continue
                packet, self._held_packet = self._held_packet or self._decoder.next_event(), None
                if packet is None:
                    break
                if not self._decided_ahead(packet):
                    self._held_packet = packet  # handled once the entitlement has decided
                    return True
                self._work = 0
                self._on_packet(packet, now)
                handled += 1 + self._work // SCAN_UNIT
                self.work_done += 1 + self._work // SCAN_UNIT
        except mqtt.MqttProtocolError as exc:
            self._protocol_error(exc.reason)
        return False

    def _read_barrier_passed(self, packet: mqtt.Connect) -> bool:
        """The CONNECT may read its client's session record: everything committed
        before it came is applied here (``ServerContext.read_barrier``; a single
        server: at once). False while the CONNECT is held for the barrier (handled
        again after it), or when the barrier failed or took too long: then refused,
        CONNACK 3. Without it, a worker or member not yet caught up with a save made
        through another (a SUBACK just sent there) found no session -- a clean CONNECT
        discarded nothing, and the session came back -- or an older record
        (``tests/cluster/test_workers_mqtt_reads.py``)."""
        barrier = self._ctx.read_barrier
        if barrier is None or self._barrier_passed or not packet.client_id or (
                self._ctx.readiness() is not None):  # (refused at once, as before)
            return True  # (an id made up for an empty one names no stored session)
        if self._barrier is None:
            self._barrier = barrier.join()
            self._barrier_until = time.monotonic() + READ_BARRIER_WAIT
            self._held_packet = packet
            return False
        reader, self._barrier = self._barrier, None
        self._barrier_passed = True
        if reader.done() and reader.result():
            return True
        self._barrier_refused(packet, "the cluster's committed position could not be read "
                              "(sequencer or seeds out of reach): try again")
        return False

    def _barrier_refused(self, packet: mqtt.Connect, why: str) -> None:
        raise NotImplementedError

    def _decided_ahead(self, packet: mqtt.Packet) -> bool:
        """Ask the entitlement ahead of handling ``packet`` (Entitlement = Custom: the
        plugin's thread) without holding the event loop: False while a decision is
        pending (``decision_pending``: the connection waits for it, reads nothing more,
        and the packet is handled after, its decisions then cached)."""
        entitlement = self._ctx.entitlement
        if entitlement.name != "Custom":
            return True
        try:
            with deferred_decisions(ahead=True):
                if isinstance(packet, mqtt.Connect):
                    checked = check_connect(packet, self.peer, self._ctx.readiness)
                    if isinstance(checked, tuple):  # the same identity for _on_connect
                        self._connect_checked = checked
                        if entitlement.allow_connect(checked[1]):
                            self._connect_ahead(packet, *checked)
                elif isinstance(packet, mqtt.Publish) and self.identity is not None:
                    subject = topic_to_subject(packet.topic)
                    if reserved(subject) is None:  # (refused before the entitlement)
                        entitlement.allow_publish(self.identity, subject)
                elif isinstance(packet, mqtt.Subscribe) and self.identity is not None:
                    limit = self._ctx.config.max_subjects_per_subscribe
                    for name, _ in packet.requests[:limit]:
                        if _valid_filter(name):  # not asked of a filter refused anyway
                            entitlement.allow_subscribe(self.identity, "/" + name)
        except DecisionPending as pending:
            self.decision_pending = pending
            return False
        except InvalidTopicError:
            pass  # refused as before, in _on_packet
        return True

    def _connect_ahead(self, packet: mqtt.Connect, client_id: str,
                       identity: ClientIdentity) -> None:
        """The will's publish (asked when the connection is lost: nothing to hold back
        then) and the filters of the persistent session this CONNECT resumes, as its
        resume asks them (each valid one; at most MqttSessionMaxSubjects were saved)."""
        entitlement = self._ctx.entitlement
        if packet.will is not None:
            subject = topic_to_subject(packet.will.topic)
            if reserved(subject) is None:
                entitlement.allow_publish(identity, subject)
        if packet.clean_session:
            return
        record = decode_record(self._ctx.hub.snapshot(session_subject(client_id)))
        for name in () if record is None else record.filters:
            if _valid_filter(name):
                entitlement.allow_subscribe(identity, "/" + name)

    def _unwrap(self, data: bytes) -> bool:
        """Feed the MQTT bytes carried in WebSocket frames; False once closing."""
        frames = self._frames
        assert frames is not None
        frames.receive_data(data)
        while (event := frames.next_event()) is not None:
            if self.closing or self.aborted:
                return False  # cut off meanwhile (pongs not read)
            if isinstance(event, ws.BinaryMessage):
                self._decoder.receive_data(event.data)
            elif isinstance(event, ws.Ping):
                self._send_frame(ws.encode_pong(event.payload))  # bounded: pings not read
            elif isinstance(event, ws.CloseReceived):
                self.close(close_codes.NORMAL.code, "")
                return False
            elif isinstance(event, ws.TextMessage):
                self._protocol_error("WebSocket: MQTT travels in binary frames")
                return False
        return True

    def _protocol_error(self, reason: str) -> None:
        stats = self._ctx.stats
        stats.protocol_errors += 1
        stats.mqtt_protocol_errors += 1
        stats.count(stats.protocol_error_kinds, "mqtt")  # GET /metrics: kind="mqtt"
        client_lines.lines.log(log, logging.INFO, "mqtt malformed", "%s: malformed MQTT, "
                               "closing: %s", self.describe(), reason, extra=self.log_fields())
        self.close(close_codes.PROTOCOL_ERROR.code, reason)
