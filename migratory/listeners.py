"""The client listeners of a server: the one place that maps a listener to its
protocols and roles.

Every front end asks its :class:`Listener` what it may do: whether the
connection is encrypted, which protocols it speaks (``native`` WebSocket,
``http`` for /publish, /snapshot and /events, ``mqtt``) and whether it accepts
publishes. A new front end (MQTT on ``ListenMqtt``) adds its addresses in
:func:`client_listeners` with its own default protocols; ``ListenerRoles`` then
applies to it like to any other listener.
"""

from __future__ import annotations

from dataclasses import dataclass

from migratory.config import Config
from migratory.config_listeners import DEFAULT_PROTOCOLS, MQTT_PROTOCOLS

PUBLISH_REFUSED_REASON = "this listener does not accept publishes (ListenerRoles)"


@dataclass(frozen=True, slots=True)
class Listener:
    address: tuple[str, int]
    encrypted: bool
    protocols: frozenset[str]
    publish: bool
    mqtt_tcp: bool = False  # a ListenMqtt port: MQTT packets straight over TCP, no HTTP

    @property
    def config_key(self) -> str:
        """The key that lists this listener's address (an error binding it names it)."""
        return ("ListenMqtt" if self.mqtt_tcp else "Listen") + (
            "Encrypted" if self.encrypted else "")

    def speaks(self, protocol: str) -> bool:
        return protocol in self.protocols

    def url(self, scheme: str = "ws") -> str:
        """``ws://host:port/`` (``wss`` when encrypted); ``scheme`` ``http`` gives http(s)."""
        host, port = self.address
        shown = f"[{host}]" if ":" in host else host
        if self.mqtt_tcp:
            scheme = "mqtt"
        return f"{scheme}{'s' if self.encrypted else ''}://{shown}:{port}/"

    def describe(self) -> str:
        access = "publish" if self.publish else "subscribe only"
        return f"{self.url()} ({','.join(sorted(self.protocols))}; {access})"


# The listener of a session not built from a config (tests, in-process tools).
OPEN_LISTENER = Listener(("", 0), encrypted=False, protocols=DEFAULT_PROTOCOLS, publish=True)


def client_listeners(config: Config) -> tuple[Listener, ...]:
    """One :class:`Listener` per address of Listen, ListenEncrypted, ListenMqtt and
    ListenMqttEncrypted (in that order), roles applied."""
    roles = {role.address: role for role in config.listener_roles}
    listeners = []
    for addresses, encrypted, default in (
        (config.listen, False, DEFAULT_PROTOCOLS),
        (config.listen_encrypted, True, DEFAULT_PROTOCOLS),
        (config.listen_mqtt, False, MQTT_PROTOCOLS),
        (config.listen_mqtt_encrypted, True, MQTT_PROTOCOLS),
    ):
        for address in addresses:
            role = roles.get(address)
            listeners.append(
                Listener(
                    address,
                    encrypted=encrypted,
                    protocols=default if role is None or role.protocols is None
                    else role.protocols,
                    publish=True if role is None else role.publish,
                    mqtt_tcp=default is MQTT_PROTOCOLS,
                )
            )
    return tuple(listeners)


def bound(listener: Listener, address: tuple[str, int]) -> Listener:
    """``listener`` with the address it really got (port 0 picks one)."""
    return Listener(
        address, listener.encrypted, listener.protocols, listener.publish, listener.mqtt_tcp
    )
