"""Config keys of the client listeners: encrypted listeners, listener roles, TLS, HTTP.

``Listen`` (plain) and ``ListenEncrypted`` (TLS) name where clients connect;
``ListenerRoles`` says, per listener, whether it accepts publishes and which
protocols it speaks. :mod:`migratory.listeners` turns the checked config into one
:class:`~migratory.listeners.Listener` per address -- the one place that maps a
listener to its protocols and roles.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from migratory.config_fields import ListenerRole
from migratory.config_values import (
    ConfigError,
    Setting,
    _int,
    _optional_addresses,
    _text,
    parse_address,
)

if TYPE_CHECKING:
    from migratory.config_fields import ConfigFields

# The protocols a listener may speak. ``native``: the WebSocket protocol
# (migratory.cbor); ``http``: POST /publish, GET /snapshot, GET /events (SSE);
# ``mqtt``: MQTT 3.1.1. Monitoring paths (/healthz, /readyz, /metrics, /stats,
# /cluster) are answered on every listener that reads HTTP.
PROTOCOLS = ("native", "http", "mqtt")
# A Listen / ListenEncrypted port: native and MQTT over WebSocket (by subprotocol), HTTP.
DEFAULT_PROTOCOLS = frozenset({"native", "http", "mqtt"})
MQTT_PROTOCOLS = frozenset({"mqtt"})  # a ListenMqtt port: MQTT over TCP only
ACCESS = {"publish": True, "subscribe": False}
DEFAULT_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


def _listener_role(text: str) -> ListenerRole:
    words = text.split()
    if len(words) not in (2, 3):
        raise ValueError(
            f"expected 'host:port publish|subscribe [protocol,...]', got {text.strip()!r}"
        )
    address = parse_address(words[0])
    access = words[1].lower()
    if access not in ACCESS:
        raise ValueError(f"expected publish or subscribe after {words[0]}, got {words[1]!r}")
    protocols = None
    if len(words) == 3:
        names = [name.strip().lower() for name in words[2].split(",") if name.strip()]
        unknown = [name for name in names if name not in PROTOCOLS]
        if unknown or not names:
            raise ValueError(
                f"{words[0]}: unknown protocol {(unknown or [words[2]])[0]!r} "
                f"(expected {', '.join(PROTOCOLS)})"
            )
        protocols = frozenset(names)
    return ListenerRole(address, ACCESS[access], protocols)


def _listener_roles(text: str) -> tuple[ListenerRole, ...]:
    return tuple(_listener_role(item) for item in text.split(";") if item.strip())


def _tls_version(text: str) -> str:
    if text not in ("1.2", "1.3"):
        raise ValueError(f"expected 1.2 or 1.3, got {text!r}")
    return text


def _origins(text: str) -> tuple[str, ...]:
    origins = tuple(item.strip() for item in text.split(",") if item.strip())
    for origin in origins:
        if origin != "*" and not origin.startswith(("http://", "https://")):
            raise ValueError(f"expected * or origins like https://example.com, got {origin!r}")
        if any(c.isspace() or c in "\r\n\0" for c in origin):
            raise ValueError(f"invalid origin {origin!r}")
    if "*" in origins and len(origins) > 1:
        raise ValueError("'*' allows every origin: list it alone")
    return origins


LISTENER_SETTINGS: tuple[Setting, ...] = (
    Setting("ListenEncrypted", "listen_encrypted", _optional_addresses, "",
            "Comma-separated host:port addresses that accept only TLS connections (wss://, "
            "https://); needs TlsCertificate and TlsKey. A listener is in Listen or here, not "
            "both."),
    Setting("ListenerRoles", "listener_roles", _listener_roles, "",
            "Per listener, `host:port publish|subscribe [protocol,...]`, entries separated by "
            "`;`. `subscribe`: publishes on that listener are refused with PUBLISH_DENIED; "
            "`publish`: publishing allowed. Protocols: native (WebSocket), http (/publish, "
            "/snapshot, /events), mqtt (over WebSocket by subprotocol on Listen ports); "
            "default native,http,mqtt (ListenMqtt ports: mqtt). A listener not named accepts "
            "publishes and speaks its default protocols. Example (seed Figure 5.2): "
            "`0.0.0.0:443 subscribe; 192.168.1.1:8801 publish`."),
    Setting("TlsCertificate", "tls_certificate", _text, "",
            "PEM file with the server certificate (and its chain) for ListenEncrypted."),
    Setting("TlsKey", "tls_key", _text, "",
            "PEM file with the private key of TlsCertificate."),
    Setting("TlsClientCa", "tls_client_ca", _text, "",
            "PEM file of the CA(s) that sign client certificates: set, every TLS client must "
            "present a certificate it signed (mutual TLS); empty: none asked."),
    Setting("TlsMinimumVersion", "tls_minimum_version", _tls_version, "1.2",
            "Oldest TLS version accepted: 1.2 or 1.3."),
    Setting("TlsCiphers", "tls_ciphers", _text, DEFAULT_CIPHERS,
            "OpenSSL cipher list for TLS 1.2 (TLS 1.3 suites are OpenSSL's defaults)."),
    Setting("HttpCorsOrigins", "http_cors_origins", _origins, "",
            "Origins whose browser pages may call /publish, /snapshot and /events "
            "(comma-separated, or `*`); empty: no CORS headers (same-origin only)."),
    Setting("SseHeartbeatInterval", "sse_heartbeat_interval", _int(1, 3600, " of seconds"), "15",
            "Seconds between heartbeat comments on an idle Server-Sent Events stream (keeps "
            "proxies from closing it)."),
)


def check_listeners(config: ConfigFields, key: Callable[[str], str]) -> None:
    """Rules between the listener keys; ConfigError naming the key otherwise."""
    plain = {a for a in config.listen if a[1] != 0}
    both = plain & {a for a in config.listen_encrypted if a[1] != 0}
    if both:
        host, port = sorted(both)[0]
        raise ConfigError(
            f"{host}:{port} is in both {key('Listen')} and {key('ListenEncrypted')}"
        )
    everywhere = (
        config.listen + config.listen_encrypted + config.listen_mqtt
        + config.listen_mqtt_encrypted
    )
    seen: set[tuple[str, int]] = set()
    for role in config.listener_roles:
        host, port = role.address
        if role.address in seen:
            raise ConfigError(f"{key('ListenerRoles')}: {host}:{port} is named twice")
        seen.add(role.address)
        count = everywhere.count(role.address)
        if count == 0:
            raise ConfigError(
                f"{key('ListenerRoles')}: {host}:{port} is not in Listen, ListenEncrypted "
                "ListenMqtt or ListenMqttEncrypted"
            )
        if count > 1:
            raise ConfigError(f"{key('ListenerRoles')}: {host}:{port} names several listeners")
    _check_tls(config, key)


def _check_tls(config: ConfigFields, key: Callable[[str], str]) -> None:
    # the monitoring listener (MonitorEncrypted) uses the same certificate and key
    encrypted = next(
        (name for name, on in (
            ("ListenEncrypted", config.listen_encrypted),
            ("ListenMqttEncrypted", config.listen_mqtt_encrypted),
            ("MonitorEncrypted", config.monitor_encrypted),
        ) if on),
        None,
    )
    if encrypted is None:
        for name, value in (
            ("TlsCertificate", config.tls_certificate),
            ("TlsKey", config.tls_key),
            ("TlsClientCa", config.tls_client_ca),
        ):
            if value:
                raise ConfigError(
                    f"{key(name)} is set but ListenEncrypted is empty (and ListenMqttEncrypted, "
                    "MonitorEncrypted off)"
                )
        return
    for name, value in (("TlsCertificate", config.tls_certificate), ("TlsKey", config.tls_key)):
        if not value:
            raise ConfigError(f"{key(encrypted)} is set: {name} is required")
    from migratory.tls import TlsSetupError, server_context  # ssl only, no I/O

    try:
        server_context(config)
    except TlsSetupError as exc:
        raise ConfigError(f"{key(exc.key)}: {exc.reason}") from None


def check_listener_clash(config: ConfigFields, key: Callable[[str], str]) -> None:
    """One address (port 0 aside) is bound once: by one listener key, once in it, and
    not by this member's cluster link or its Raft port (the link's + 1, a seed's). They
    were found only when the second bind failed -- exit 1, 'Address already in use',
    the cluster's line asking for 'another member with this address on this host'."""
    seen: dict[tuple[str, int], str] = {}
    for label, addresses in (
        (key("Listen"), config.listen),
        (key("ListenEncrypted"), config.listen_encrypted),
        (key("ListenMqtt"), config.listen_mqtt),
        (key("ListenMqttEncrypted"), config.listen_mqtt_encrypted),
        *_cluster_binds(config, key),
    ):
        for address in addresses:
            other = seen.get(address)
            if address[1] and other is not None:
                where = f"{other} names" if other == label else f"{other} and {label} both name"
                twice = " twice" if other == label else ""
                raise ConfigError(f"{where} {address[0]}:{address[1]}{twice}")
            seen[address] = label


def _cluster_binds(
    config: ConfigFields, key: Callable[[str], str]
) -> tuple[tuple[str, tuple[tuple[str, int], ...]], ...]:
    """This member's cluster link address and, on a Guaranteed seed, its Raft port's."""
    if not config.clustered:
        return ()
    name = key("ClusterMemberBind" if config.cluster_member_bind else "ClusterMemberListen")
    host, port = config.cluster_bind
    link = (f"the cluster link of {name}", ((host, port),))
    if config.cluster_delivery_mode != "Guaranteed" or not config.is_seed:
        return (link,)
    return link, (f"the Raft port (the cluster port + 1) of {name}", ((host, port + 1),))
