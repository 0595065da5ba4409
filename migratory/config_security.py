"""The configuration keys of security: entitlement (Token, Custom) and the limits that
bound what clients may make the server hold or do.

Each limit refuses with a documented status or close code; docs/security.md says which
attack each one stops and docs/config.md (generated) lists them with the other keys.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from migratory.config_values import ConfigError, Setting, _choice, _int, _networks, _text

if TYPE_CHECKING:
    from migratory.config_fields import ConfigFields

_UNITS = {"c": " of connections", "b": " of bytes", "s": " of subjects", "p": " of publishes"}

LIMIT_SETTINGS: tuple[Setting, ...] = (
    Setting("MaxConnections", "max_connections", _int(0, unit=_UNITS["c"]), "0",
            "Client connections open at once; one more is answered 503 and closed. 0: the "
            "open-file limit minus FileDescriptorReserve."),
    Setting("FileDescriptorReserve", "file_descriptor_reserve", _int(16, unit=" of files"),
            "512",
            "File descriptors kept free for Raft, cluster links and files whatever clients do "
            "(used when MaxConnections = 0)."),
    Setting("MaxConnectionsPerAddress", "max_connections_per_address", _int(0, unit=_UNITS["c"]),
            "1000",
            "Client connections open at once from one IP address (0: no limit; raise it "
            "behind a proxy or NAT that gathers many clients on one address)."),
    Setting("MaxHandshakesPerAddress", "max_handshakes_per_address", _int(0, unit=_UNITS["c"]),
            "100",
            "Connections from one IP address that have not finished `connect` (MQTT "
            "CONNECT) nor had an HTTP request answered yet (0: no limit); one more is "
            "answered 503 and closed."),
    Setting("MaxPendingHandshakes", "max_pending_handshakes", _int(1, unit=_UNITS["c"]),
            "1000",
            "Connections of one listener that have not finished their handshake (TLS, "
            "WebSocket upgrade or HTTP request, `connect`, MQTT CONNECT) yet, HTTP "
            "keep-alive connections between requests included; one more closes the oldest "
            "of them (of an address holding more than half, if any; never one whose "
            "request waits for its answer, or whose answers wait to be written). When "
            "the server is full (MaxConnections) a newcomer closes the oldest of these "
            "instead of being refused: connections that send nothing, or a byte at a time "
            "(slowloris), cannot lock clients out, whose handshake takes milliseconds "
            "(docs/security.md)."),
    Setting("MaxConnectionRatePerAddress", "max_connection_rate_per_address",
            _int(0, unit=" of connections a second"), "100",
            "New connections one IP address (an IPv6 address: its PerAddressIPv6Prefix "
            "network) may open per second on the client ports, bursts of one second's worth; "
            "one more is closed (reset) as soon as it is accepted, before any TLS or HTTP "
            "work: a flood of ClientHellos from one address cannot spend the server's CPU "
            "on handshakes (docs/security.md). 0: no limit (behind a proxy or NAT that "
            "gathers many clients on one address, raise it or set 0)."),
    Setting("MaxTlsHandshakeRate", "max_tls_handshake_rate",
            _int(0, unit=" of connections a second"), "500",
            "New connections the encrypted client ports (ListenEncrypted, "
            "ListenMqttEncrypted) take per second, all addresses together (each a TLS "
            "handshake, ~0.3 ms of CPU), bursts of one second's worth, shared between "
            "the addresses connecting: an address under its share (this rate / (the "
            "addresses seen in the last second + 1)) is admitted first, one over it only "
            "while half a second's worth is left. One more is reset as soon as it is "
            "accepted, before any TLS work: a ClientHello flood from many addresses "
            "cannot starve a client from its own address (docs/security.md). From one "
            "address alone (a TCP load balancer's) a plain bound. 0: no limit."),
    Setting("PerAddressIPv6Prefix", "per_address_ipv6_prefix", _int(1, 128, " of bits"), "64",
            "The client ports' per-address limits (MaxConnectionsPerAddress, "
            "MaxHandshakesPerAddress, MaxConnectionRatePerAddress, the MaxPendingHandshakes "
            "fairness) count an IPv6 address as its network of this many bits: whoever has "
            "one address of a /64 has 2^64 of them. 128: each address alone. IPv4 "
            "addresses (also mapped ones, ::ffff:a.b.c.d) count alone. (The cluster link "
            "port counts by /64.)"),
    Setting("MaxSubscriptionsPerConnection", "max_subscriptions_per_connection",
            _int(1, unit=_UNITS["s"]), "10000",
            "Subjects one connection may be subscribed to; more get SUBSCRIBE_DENY (MQTT: "
            "topic filters, at most 1,000 whatever this says; SUBACK 0x80)."),
    Setting("MaxSubscriptions", "max_subscriptions", _int(0, unit=_UNITS["s"]), "1000000",
            "Subscriptions of all clients together -- native subjects, MQTT topic filters, "
            "SSE stream subjects; more get SUBSCRIBE_DENY (MQTT: SUBACK 0x80; a GET /events "
            "stream: 503 before it subscribes to anything), counted in "
            "migratory_subscriptions_refused_total{limit=\"MaxSubscriptions\"}. A "
            "persistent MQTT session's resume takes its filters back past it (they count). "
            "0: no limit."),
    Setting("MaxSubjects", "max_subjects", _int(0, unit=_UNITS["s"]), "5000000",
            "Subjects this server holds at most (~1.3 KB each, more with their cached "
            "messages); a publish to a new subject past it gets PUBLISH_FAILED. Subjects "
            "with a snapshot (retained) are kept for good, one-off ones until their "
            "messages expire. 0: no limit."),
    Setting("MaxSubjectsPerSubscribe", "max_subjects_per_subscribe", _int(1, 10_000, _UNITS["s"]),
            "1000",
            "Entries one `subscribe` operation may carry; more close the session with 4000. "
            "Told to clients in `connected`: the SDKs split a larger subscribe (a reconnect "
            "resubscribes every subject at once)."),
    Setting("MaxPublishesPerSecond", "max_publishes_per_second", _int(0, unit=_UNITS["p"]),
            "50000",
            "Publishes one connection may send per second (a burst of one second's worth is "
            "allowed); more get PUBLISH_FAILED at once. 0: no limit."),
    Setting("MaxFragmentsPerMessage", "max_fragments_per_message", _int(1, unit=" of frames"),
            "1024",
            "WebSocket frames one client message may be split into (MQTT over WebSocket "
            "too); more close with 1008 (MQTT over WebSocket: the connection is closed)."),
    Setting("IncompleteFrameBudget", "incomplete_frame_budget", _int(1 << 20, unit=_UNITS["b"]),
            "67108864",
            "Bytes all client connections together may hold in frames, MQTT packets and HTTP "
            "request bodies not yet complete; the connection that would pass it is closed "
            "with 1013 (an HTTP request: 503)."),
    Setting("OutboxMemoryBudget", "outbox_memory_budget", _int(0, unit=_UNITS["b"]),
            "1073741824",
            "Bytes the outboxes of all clients together may hold, with the QoS 1 messages "
            "MQTT subscribers have not acknowledged (176 bytes each); past it, a client with "
            "more than a sixteenth of ClientMaxPendingBytes queued (or of its QoS 1 messages "
            "not acknowledged) is cut off as a slow consumer (4500). 0: no budget."),
    Setting("PublishAllowFromAddressList", "publish_allow_from_address_list", _networks, "",
            "Comma-separated addresses or CIDR networks (`10.0.0.0/8, ::1`) publishes are "
            "accepted from; others get PUBLISH_DENIED. Empty: any address."),
)

ENTITLEMENT_SETTINGS: tuple[Setting, ...] = (
    Setting("EntitlementTokenAlgorithm", "entitlement_token_algorithm",
            _choice("HS256", "RS256", "ES256"), "HS256",
            "Entitlement = Token: the JWT signature algorithm accepted (one)."),
    Setting("EntitlementTokenKeyFile", "entitlement_token_key_file", _text, "",
            "Entitlement = Token: a file with the HS256 secret (32 bytes or more) or the "
            "RS256/ES256 public key (PEM; a private key is refused). Keep it mode 0600."),
    Setting("EntitlementTokenJwksFile", "entitlement_token_jwks_file", _text, "",
            "Entitlement = Token: instead of EntitlementTokenKeyFile, a JWKS file of RS256/ES256 "
            "public keys (no private ones), chosen by the token's `kid`."),
    Setting("EntitlementTokenIssuer", "entitlement_token_issuer", _text, "",
            "Entitlement = Token: when set, tokens must carry this `iss`."),
    Setting("EntitlementTokenAudience", "entitlement_token_audience", _text, "",
            "Entitlement = Token: when set, tokens must carry this `aud`."),
    Setting("EntitlementPlugin", "entitlement_plugin", _text, "",
            "Entitlement = Custom: the plugin class as `module:Class` (see docs/security.md)."),
    Setting("EntitlementPluginOptions", "entitlement_plugin_options", _text, "",
            "Entitlement = Custom: one text passed to the plugin's constructor."),
    Setting("EntitlementPluginTimeout", "entitlement_plugin_timeout",
            _int(1, 10_000, " of milliseconds"), "500",
            "Entitlement = Custom: how many milliseconds the server waits for one answer of "
            "the plugin (it runs in a thread of its own; the client asking waits for it, the "
            "others are served meanwhile). Later: "
            "that decision is denied, and so is every uncached one until the late call "
            "returns."),
)

CLUSTER_TLS_SETTINGS: tuple[Setting, ...] = (
    Setting("ClusterTlsCertificate", "cluster_tls_certificate", _text, "",
            "PEM: this member's certificate, signed by ClusterTlsCa; set with ClusterTlsKey "
            "and ClusterTlsCa, cluster links run over mutual TLS 1.3 (`migratory cluster up` "
            "makes them, unless given `--no-cluster-tls`). Empty: links are plain TCP, "
            "password-authenticated."),
    Setting("ClusterTlsKey", "cluster_tls_key", _text, "",
            "PEM: the private key of ClusterTlsCertificate (keep it mode 0600)."),
    Setting("ClusterTlsCa", "cluster_tls_ca", _text, "",
            "PEM: the cluster CA; a peer must present a certificate it signed."),
)


def check_cluster_tls(config: ConfigFields, key: Callable[[str], str]) -> None:
    """All three ClusterTls* keys or none, only in a cluster, and files that load."""
    values = {
        "ClusterTlsCertificate": config.cluster_tls_certificate,
        "ClusterTlsKey": config.cluster_tls_key,
        "ClusterTlsCa": config.cluster_tls_ca,
    }
    given = [name for name, value in values.items() if value]
    if not given:
        return
    if not config.cluster_members:
        raise ConfigError(f"{key(given[0])} is set but ClusterMembers is empty")
    missing = [name for name, value in values.items() if not value]
    if missing:
        raise ConfigError(f"{key(given[0])} is set: {missing[0]} is required too")
    from migratory.tls import TlsSetupError, cluster_contexts  # ssl only, no I/O

    try:
        cluster_contexts(*values.values())
    except TlsSetupError as exc:
        raise ConfigError(f"{key(exc.key)}: {exc.reason}") from None
