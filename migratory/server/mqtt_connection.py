"""The trio adapter for one MQTT client socket over TCP: the native adapter's reading,
writing and closing (with MQTT's keep-alive, see ``Connection._read_until_closing``)
around an :class:`MqttSession`."""

from __future__ import annotations

from migratory.server.connection import Connection
from migratory.server.mqtt_session import MqttSession


class MqttConnection(Connection):
    __slots__ = ()

    def _new_session(self, peer: str) -> MqttSession:
        return MqttSession(
            self.server.ctx, self, peer, self.server.mqtt_sessions, self.listener
        )
