"""The trio adapter for one MQTT client socket over TCP: the native adapter's reading,
writing and closing (with MQTT's keep-alive, see ``Connection._read_until_closing``)
around an :class:`MqttSession`."""

from __future__ import annotations

import contextlib

from migratory.server.connection import Connection
from migratory.server.limits import MQTT_REFUSAL
from migratory.server.mqtt_session import MqttSession


class MqttConnection(Connection):
    __slots__ = ()

    def _new_session(self, peer: str) -> MqttSession:
        return MqttSession(
            self.server.ctx, self, peer, self.server.mqtt_sessions, self.listener
        )

    def evict(self) -> None:
        """Close at once for a newcomer's room; on a plain port, a client whose CONNECT
        is not answered is told CONNACK 3 first (one non-blocking send), as one refused
        at the door (client_accept.refuse)."""
        if self._tls is None and not self.session.connected:
            with contextlib.suppress(OSError):
                self.sock.send(MQTT_REFUSAL)
        super().evict()
