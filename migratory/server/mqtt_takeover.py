"""One connection per MQTT client id across the processes of a Guaranteed cluster or of
``Workers = N`` (MQTT 3.1.1 section 3.1.4: a CONNECT of a client id already connected
closes the existing connection).

Within one process a CONNECT closes the older connection of its client id itself
(``MqttSession._take_over``). Another member or worker does not know of it: before, a
device that reconnected through another member left its first connection open there
-- delivering to it and holding its subscriptions -- until its keep-alive ran out.

So an accepted CONNECT whose client gave its id is announced in a *takeover notice* --
not retained, on the reserved subject :data:`TAKEOVER_SUBJECT`, a line per CONNECT: a
token of the connection and the client id (in hex: an id may hold any character) --
published through the publish path, and every process applies the notices in the one
order of the committed stream. A connection arms itself when its own line comes back;
once armed, a line of its client id with another token is of a later CONNECT: it is
closed (``taken over``). A line that comes before its own is of an earlier CONNECT
(committed before its own): ignored, that one is closed where it is. So exactly the last
CONNECT of the stream stays, on every member.

**A persistent session stays with the connection whose record stands.** Two CONNECTs
of one client id at once read one stored record and write one generation; of the two,
the record of the higher writer stands (``model/snapshot.py``: the order of the stream
does not decide it). So a CONNECT's line comes with its connection's *key* -- the
generation and writer of what its take-up writes (its record, or a clean session's
discard), on a line before its own that an earlier member skips (:func:`notice_line`) -- and
between two connections that both have one the higher key stays, whichever line came
last: the other is closed where its line or the higher one is applied. Before, the two
orders were decided apart; when they disagreed, the connection that stayed found its
session "taken up by a later connection" at its next save and never saved again -- its
SUBSCRIBEs' SUBACKs held for ever, or sent for filters never saved, gone at the next
CONNECT (``test_mqtt_takeover.py``). A line without a key (a member of an earlier
version, a clean session that discarded nothing, a persistent one that had none stored:
its first save comes with its first SUBSCRIBE, maybe after a later CONNECT found nothing)
goes by the stream's order; and a connection that finds at a save that its session was
taken up by another record than its own closes itself (``MqttSaving._changed``): never
left open saving nothing.

**Coalesced**, as the read barrier: one notice in flight per process; the CONNECTs that
come meanwhile go into the next one (up to :data:`NOTICE_BYTES` of lines each). A storm
of reconnects after a member's failure costs a notice per commit round trip, not a
publish per CONNECT (which would fill ``ClusterMaxPendingPublishes`` and refuse the
clients' own publishes).

A single server of one process (nothing committed elsewhere) publishes no notice. Nor
does a Standard cluster, which orders no publishes across members.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from migratory import client_lines
from migratory.model.message import Message, Qos
from migratory.model.position import Position
from migratory.model.snapshot import generation_key
from migratory.protocol import close_codes, ops
from migratory.server.mqtt_saving import MqttSaving
from migratory.server.mqtt_store import TakenUp

if TYPE_CHECKING:
    from migratory.server.context import PublishPath, ServerContext

log = logging.getLogger("migratory.mqtt")

TAKEOVER_SUBJECT = "/$mqtt-takeover/connect"
"""Where takeover notices are published (``/$``: reserved, refused to clients)."""

NOTICE_BYTES = 16_384
"""The lines of one notice, at most (a line is ~18 bytes plus twice its client id's)."""


def new_token() -> str:
    """A token naming one connection among every process's (random: pids and connection
    numbers repeat across members)."""
    return os.urandom(8).hex()


def notice_line(client_id: str, token: str, key: str = "") -> str:
    """A CONNECT's line -- and, when it has a ``key`` (:func:`record_key`'s text), a line
    before it naming the token and the key (``=<token> <key>``), which a member of an
    earlier version skips (its id does not read as hex) while it still reads the CONNECT's
    own line as it always did: one notice for both during a rolling upgrade."""
    line = f"{token} {client_id.encode('utf-8').hex()}"
    return f"={token} {key}\n{line}" if key else line


def record_key(fields: Mapping[str, str]) -> str:
    """The key of a record a take-up writes (its fields): ``generation:writer``."""
    key = generation_key(fields)
    return "" if key is None else f"{key[0]}:{key[1]}"


def read_key(text: str) -> tuple[int, str] | None:
    generation, _, writer = text.partition(":")
    return (int(generation), writer) if generation.isdigit() and writer else None


class Noticed(Protocol):
    """What a connection does with a notice of its client id (``MqttSession``)."""

    def takeover_noticed(self, token: str, key: tuple[int, str] | None = None) -> None: ...


class Takeovers:
    """One process's side of it: announces this process's CONNECTs (:meth:`announce`,
    coalesced), and, as the hub's listener of :data:`TAKEOVER_SUBJECT`, hands each line
    applied to the connection of its client id here, if there is one. ``registry``:
    client id -> its live session (the server's ``mqtt_sessions``); ``clock``: the time
    a notice is submitted at."""

    def __init__(self, publishing: PublishPath, registry: Mapping[str, Noticed],
                 clock: Callable[[], float]) -> None:
        self._publishing = publishing
        self._registry = registry
        self._clock = clock
        # (client id, token, key) not in a notice yet, and those of the notice in flight
        self._waiting: list[tuple[str, str, str]] = []
        self._in_flight: list[tuple[str, str, str]] | None = None
        self.submitted = 0  # notices published
        self.failed = 0  # notices whose publish failed

    def announce(self, client_id: str, now: float, key: str = "") -> str:
        """A CONNECT of ``client_id`` accepted here (``key``: its take-up's,
        :func:`record_key`): its connection's token."""
        token = new_token()
        self._waiting.append((client_id, token, key))
        if self._in_flight is None:
            self._submit(now)
        return token

    def _submit(self, now: float) -> None:
        lines: list[str] = []
        size = 0
        for client_id, token, key in self._waiting:
            line = notice_line(client_id, token, key)
            size += len(line) + 1
            if lines and size > NOTICE_BYTES:
                break
            lines.append(line)
        self._in_flight, self._waiting = (self._waiting[:len(lines)],
                                          self._waiting[len(lines):])
        self.submitted += 1
        notice = Message(TAKEOVER_SUBJECT, "\n".join(lines).encode(), qos=Qos.GUARANTEED)
        self._publishing.submit(notice, self, now)

    # --- the notice's PublishReply: the next one goes once it has landed --------

    def publish_result(self, status: ops.PublishStatus) -> None:
        self._landed(ok=status.status is ops.Status.PUBLISH_OK)

    def publish_ok(self, closure: str | None, subject: str, epoch: int, seq: int) -> None:
        self._landed(ok=True)

    def flush(self) -> None:
        pass

    def _landed(self, *, ok: bool) -> None:
        """A notice that failed (no seed majority, an unknown outcome) closes nothing
        elsewhere; its connections are armed here all the same, or no later CONNECT of
        their client ids would ever close them."""
        announced, self._in_flight = self._in_flight or [], None
        if not ok:
            self.failed += 1
            for client_id, token, _ in announced:
                session = self._registry.get(client_id)
                if session is not None:
                    session.takeover_noticed(token)
        if self._waiting:
            self._submit(self._clock())

    # --- the hub's listener -----------------------------------------------------

    def resync(self, subject: str, position: Position, snapshot: Message | None,
               qos: int) -> None:
        """Notices are not retained: one a cache sync jumped over is not here to read."""

    def deliver_message(self, message: Message, qos: int) -> None:
        registry = self._registry
        keys: dict[bytes, bytes] = {}  # token -> its key, from the line before its own
        for line in message.content.split(b"\n"):
            token, _, hexed = line.partition(b" ")
            if token.startswith(b"="):
                keys[token[1:]] = hexed
                continue
            try:
                client_id = bytes.fromhex(hexed.decode("ascii")).decode("utf-8")
            except ValueError:  # (no process writes one)
                continue
            session = registry.get(client_id)
            if session is not None:
                key = keys.get(token)
                session.takeover_noticed(token.decode("ascii", "replace"), None if key is None
                                         else read_key(key.decode("ascii", "replace")))


class MqttTakeover(MqttSaving):
    """A base of :class:`~migratory.server.mqtt_session.MqttSession`: its connection
    taken over by a later CONNECT of its client id, here or elsewhere."""

    __slots__ = ("_takeover_armed", "_takeover_key", "_takeover_token")
    _ctx: ServerContext
    _takeover_armed: bool  # its own line came back: a later one closes it
    _takeover_token: str  # "" while it announced none
    _takeover_key: tuple[int, str] | None  # its take-up's record key (None: none)

    def _publish_takeover(self, client_id: str, now: float, taken: TakenUp) -> None:
        """An accepted CONNECT of ``client_id`` (the client's own, not a made-up one)
        tells the other processes, which close their connection of it. ``taken``: its
        take-up, whose record (a persistent session's, or a clean one's discard) keys it."""
        takeovers = self._ctx.takeovers
        if takeovers is not None:
            record = taken.record  # (keyed only when the take-up writes it now: a fresh
            # session's first save comes later, maybe after a later CONNECT read nothing)
            key = (record_key(taken.discard.fields) if taken.discard is not None
                   else f"{record.generation}:{record.writer}"
                   if record is not None and record.writer
                   and (taken.stored is not None or taken.expired) else "")
            self._takeover_key = read_key(key)
            self._takeover_token = takeovers.announce(client_id, now, key)

    def takeover_noticed(self, token: str, key: tuple[int, str] | None = None) -> None:
        """A notice of this connection's client id, in the committed stream's order; ``key``:
        the take-up's of the CONNECT it names (None: none, or not told)."""
        if token == self._takeover_token:
            self._takeover_armed = True
            return
        if self.closing or self.aborted:
            return
        mine = self._takeover_key
        if key is not None and mine is not None:  # the session's record decides
            if key > mine:
                self.taken_over("by a connection on another member or worker")
            return
        if self._takeover_armed:
            self.taken_over("by a connection on another member or worker")

    def taken_over(self, where: str) -> None:
        """Closed for a later connection of the same client id (its will is published:
        the connection ends without DISCONNECT)."""
        client_lines.lines.log(log, logging.INFO, "mqtt taken over", "%s: taken over %s",
                               self.describe(), where, extra=self.log_fields())
        self.close(close_codes.NORMAL.code, "taken over")
        self.flush()
