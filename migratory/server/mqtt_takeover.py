"""One connection per MQTT client id across the processes of a Guaranteed cluster or of
``Workers = N`` (MQTT 3.1.1 section 3.1.4: a CONNECT of a client id already connected
closes the existing connection).

Within one process a CONNECT closes the older connection of its client id itself
(``MqttSession._take_over``). Another member or worker does not know of it: before, a
device that reconnected through another member left its first connection open there
-- delivering to it and holding its subscriptions -- until its keep-alive ran out.

So an accepted CONNECT whose client gave its id publishes a *takeover notice* -- not
retained, on the reserved subject :data:`TAKEOVER_SUBJECT`, carrying a token of the
connection and the client id -- through the publish path, and every process applies the
notices in the one order of the committed stream. A connection arms itself when its own
notice comes back; once armed, a notice of its client id with another token is of a
later CONNECT: it is closed (``taken over``). A notice that comes before its own is of
an earlier CONNECT (committed before its own): ignored, that one is closed where it is.
So exactly the last CONNECT of the stream stays, on every member.

A single server of one process (nothing committed elsewhere) publishes no notice. Nor
does a Standard cluster, which orders no publishes across members.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from migratory.model.message import Message, Qos
from migratory.protocol import close_codes
from migratory.server.mqtt_saving import MqttSaving

if TYPE_CHECKING:
    from migratory.server.context import ServerContext

log = logging.getLogger("migratory.mqtt")

TAKEOVER_SUBJECT = "/$mqtt-takeover/connect"
"""Where takeover notices are published (``/$``: reserved, refused to clients)."""


def new_token() -> str:
    """A token naming one connection among every process's (random: pids and connection
    numbers repeat across members)."""
    return os.urandom(8).hex()


def takeover_notice(client_id: str, token: str) -> Message:
    """The notice a CONNECT of ``client_id`` publishes (``token`` names its connection)."""
    return Message(TAKEOVER_SUBJECT, f"{token} {client_id}".encode(), qos=Qos.GUARANTEED)


class Noticed(Protocol):
    """What a connection does with a notice of its client id (``MqttSession``)."""

    def takeover_noticed(self, token: str) -> None: ...


class TakeoverNotices:
    """The hub's listener of :data:`TAKEOVER_SUBJECT` on one process: each notice goes to
    the connection of its client id here, if there is one. ``registry``: client id -> the
    live session (the server's ``mqtt_sessions``)."""

    __slots__ = ("_registry",)

    def __init__(self, registry: Mapping[str, Noticed]) -> None:
        self._registry = registry

    def deliver_message(self, message: Message, qos: int) -> None:
        token, _, client_id = message.content.decode("utf-8", "replace").partition(" ")
        session = self._registry.get(client_id)
        if session is not None:
            session.takeover_noticed(token)


class MqttTakeover(MqttSaving):
    """A base of :class:`~migratory.server.mqtt_session.MqttSession`: its connection
    taken over by a later CONNECT of its client id, here or elsewhere."""

    __slots__ = ("_takeover_armed", "_takeover_token")
    _ctx: ServerContext
    _takeover_armed: bool  # its own notice came back: a later one closes it
    _takeover_token: str  # "" while it published none

    def _publish_takeover(self, client_id: str, now: float) -> None:
        """An accepted CONNECT of ``client_id`` (the client's own, not a made-up one)
        tells the other processes, which close their connection of it."""
        self._takeover_token = token = new_token()
        self._ctx.publishing.submit(takeover_notice(client_id, token), None, now)

    def takeover_noticed(self, token: str) -> None:
        """A notice of this connection's client id, in the committed stream's order."""
        if token == self._takeover_token:
            self._takeover_armed = True
        elif self._takeover_armed and not (self.closing or self.aborted):
            self.taken_over("by a connection on another member or worker")

    def taken_over(self, where: str) -> None:
        """Closed for a later connection of the same client id (its will is published:
        the connection ends without DISCONNECT)."""
        log.info("%s: taken over %s", self.describe(), where, extra=self.log_fields())
        self.close(close_codes.NORMAL.code, "taken over")
        self.flush()
