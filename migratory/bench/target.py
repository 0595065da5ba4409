"""Where the load goes: a server or broker named by URL, or a server the bench starts.

``ws://HOST:PORT`` is a migratory server (native WebSocket + CBOR, ``GET /stats``
on the same port); ``mqtt://HOST:PORT`` is any MQTT 3.1.1 broker (migratory's
MQTT listener, mosquitto, nats-server's MQTT front end). When the server runs on
this machine, the process that listens on the port is found in /proc so that its
CPU and RSS can be measured; ``--pid`` names it explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from migratory.bench.procfs import pid_listening_on

DEFAULT_PORTS = {"ws": 8800, "mqtt": 1883}
PROTOCOLS = {"ws": "native", "mqtt": "mqtt"}


class TargetError(ValueError):
    """A URL the bench cannot drive."""


@dataclass(frozen=True, slots=True)
class Target:
    """A server under test, as the load processes reach it."""

    name: str  # "migratory", "mosquitto", "nats-server", or the URL
    protocol: str  # what the publisher speaks: "native" or "mqtt"
    host: str
    port: int  # the publisher's port: WebSocket (native) or MQTT
    mqtt_port: int = 0  # a migratory server's MQTT listener (subscribers over MQTT)
    pid: int = 0  # the server's process on this machine (CPU, RSS); 0 = not measured
    stats: bool = False  # answers GET /stats on host:port (a migratory server)

    @property
    def url(self) -> str:
        scheme = "ws" if self.protocol == "native" else "mqtt"
        return f"{scheme}://{self.host}:{self.port}"

    def port_for(self, protocol: str) -> int:
        """The port clients of ``protocol`` (native, mqtt, sse) connect to (raises if none)."""
        if self.protocol == "mqtt":
            if protocol != "mqtt":
                raise TargetError(f"{self.url} is an MQTT broker: its clients must use mqtt")
            return self.port
        if protocol == "mqtt":
            if not self.mqtt_port:
                raise TargetError(f"{self.url}: give its MQTT listener with --mqtt mqtt://HOST:PORT")
            return self.mqtt_port
        return self.port


def target_from_url(url: str, *, name: str = "", pid: int = 0) -> Target:
    """A Target from ``ws://HOST:PORT`` or ``mqtt://HOST:PORT``."""
    parts = urlsplit(url)
    if parts.scheme not in PROTOCOLS:
        raise TargetError(f"{url!r}: the URL must start with ws:// or mqtt://")
    if not parts.hostname:
        raise TargetError(f"{url!r}: no host")
    try:
        port = parts.port or DEFAULT_PORTS[parts.scheme]
    except ValueError as exc:
        raise TargetError(f"{url!r}: {exc}") from None
    protocol = PROTOCOLS[parts.scheme]
    return Target(
        name=name or url,
        protocol=protocol,
        host=parts.hostname,
        port=port,
        pid=pid or pid_listening_on(port),
        stats=protocol == "native",
    )


def with_mqtt_listener(target: Target, mqtt_url: str) -> Target:
    """A migratory target whose subscribers may also come over its MQTT listener."""
    mqtt = target_from_url(mqtt_url)
    return replace(target, mqtt_port=mqtt.port)
