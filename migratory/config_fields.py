"""The configuration's record: every key's parsed value, and what derives from them.

:class:`migratory.config.Config` is this record built from the settings (defaults, a
file, the environment, ``--set``) and checked. The modules of the keys and of their
rules (``config_cluster``, ``config_listeners``, ... and :mod:`migratory.tls`) read
this one, below :mod:`migratory.config`: the config composes them, never the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network

from migratory.config_keepalive import KeepAlive


@dataclass(frozen=True, slots=True)
class ListenerRole:
    """``host:port publish|subscribe [protocol,...]`` -- one entry of ListenerRoles."""

    address: tuple[str, int]
    publish: bool
    protocols: frozenset[str] | None  # None: the listener's default protocols

    def as_text(self) -> str:
        host, port = self.address
        shown = f"[{host}]" if ":" in host else host
        access = "publish" if self.publish else "subscribe"
        protocols = "" if self.protocols is None else " " + ",".join(sorted(self.protocols))
        return f"{shown}:{port} {access}{protocols}"


@dataclass(frozen=True, slots=True)
class ConfigFields:
    """Every key's parsed value, and what derives from them (no constructor: the keys'
    rules read this; :class:`migratory.config.Config` builds it from the settings)."""

    listen: tuple[tuple[str, int], ...]
    listen_mqtt: tuple[tuple[str, int], ...]
    listen_mqtt_encrypted: tuple[tuple[str, int], ...]
    mqtt_session_expiry: int
    mqtt_max_sessions: int
    mqtt_session_max_subjects: int
    listen_encrypted: tuple[tuple[str, int], ...]
    listener_roles: tuple[ListenerRole, ...]
    tls_certificate: str
    tls_key: str
    tls_client_ca: str
    tls_minimum_version: str
    tls_ciphers: str
    http_cors_origins: tuple[str, ...]
    sse_heartbeat_interval: int
    server_name: str
    log_level: str
    entitlement: str
    entitlement_allow_token: str
    entitlement_token_algorithm: str
    entitlement_token_key_file: str
    entitlement_token_jwks_file: str
    entitlement_token_issuer: str
    entitlement_token_audience: str
    entitlement_plugin: str
    entitlement_plugin_options: str
    entitlement_plugin_timeout: int
    publish_snapshot_message: bool
    max_cached_messages_per_subject: int
    cache_expire_time: int
    cache_memory_budget: int
    batch_time: int
    batch_idle_write: bool
    encrypted_batch_time: int
    send_path: str
    max_batching_space: int
    max_message_size: int
    max_frame_size: int
    client_max_pending_bytes: int
    handshake_timeout: int
    gc_thresholds: tuple[int, int, int]
    drain_time: int
    client_tcp_keepalive: KeepAlive
    client_heartbeat_minimum: int
    max_connections: int
    file_descriptor_reserve: int
    max_connections_per_address: int
    max_handshakes_per_address: int
    max_pending_handshakes: int
    max_connection_rate_per_address: int
    max_tls_handshake_rate: int
    per_address_ipv6_prefix: int
    max_subscriptions_per_connection: int
    max_subscriptions: int
    max_subjects: int
    max_subjects_per_subscribe: int
    max_publishes_per_second: int
    max_fragments_per_message: int
    incomplete_frame_budget: int
    outbox_memory_budget: int
    publish_allow_from_address_list: tuple[IPv4Network | IPv6Network, ...]
    workers: int
    worker_hang_time: int
    cluster_members: tuple[tuple[str, int], ...]
    cluster_member_template: str
    cluster_member_count: int
    cluster_member_ordinal: int | None
    cluster_member_listen: tuple[str, int] | None
    cluster_member_bind: tuple[str, int] | None
    cluster_seed_member_count: int
    cluster_delivery_mode: str
    cluster_password: str
    cluster_tls_certificate: str
    cluster_tls_key: str
    cluster_tls_ca: str
    cluster_data_dir: str
    cluster_max_pending_publishes: int
    cluster_rebalance_rate: int
    cluster_election_timeout: int
    cluster_seed_link_wait: int
    cluster_log_compaction_entries: int
    cluster_log_compaction_time: int
    cluster_log_compaction_bytes: int
    monitor_listen: tuple[str, int] | None
    monitor_encrypted: bool
    monitor_user: str
    monitor_password: str
    monitor_token: str
    monitor_push_interval: int
    log_format: str
    audit_log_file: str
    audit_access: bool
    audit_message: bool
    audit_cache: bool
    audit_log_max_bytes: int
    audit_log_backups: int

    @property
    def clustered(self) -> bool:
        return bool(self.cluster_members)

    @property
    def member_index(self) -> int:
        """This member's index in ClusterMembers (the StatefulSet ordinal)."""
        assert self.cluster_member_listen is not None
        return self.cluster_members.index(self.cluster_member_listen)

    @property
    def cluster_bind(self) -> tuple[str, int]:
        """The address this member's cluster link binds (Raft binds its port + 1)."""
        address = self.cluster_member_bind or self.cluster_member_listen
        assert address is not None
        return address

    @property
    def seed_members(self) -> tuple[tuple[str, int], ...]:
        return self.cluster_members[: self.cluster_seed_member_count]

    @property
    def is_seed(self) -> bool:
        return self.clustered and self.member_index < self.cluster_seed_member_count
