"""Config keys of monitoring: the monitoring listener, push monitoring on meta-subjects,
the audit log and the log format (docs/monitoring.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from migratory.config_values import (
    ConfigError,
    Setting,
    _bool,
    _choice,
    _int,
    _optional_address,
    _text,
)

if TYPE_CHECKING:
    from migratory.config_fields import ConfigFields

MONITOR_SETTINGS: tuple[Setting, ...] = (
    Setting("MonitorListen", "monitor_listen", _optional_address, "",
            "host:port of the monitoring listener (HTTP: /metrics, /stats, /cluster, /healthz, "
            "/readyz); empty: those paths are answered on the client listeners instead. Set, "
            "the client listeners no longer answer /metrics, /stats and /cluster."),
    Setting("MonitorEncrypted", "monitor_encrypted", _bool, "false",
            "TLS on the monitoring listener (https://), with TlsCertificate and TlsKey (and "
            "TlsClientCa: client certificates required) as the encrypted client listeners."),
    Setting("MonitorUser", "monitor_user", _text, "",
            "User name of HTTP basic authentication on the monitoring listener (with "
            "MonitorPassword); empty: no authentication."),
    Setting("MonitorPassword", "monitor_password", _text, "",
            "Password of HTTP basic authentication on the monitoring listener."),
    Setting("MonitorToken", "monitor_token", _text, "",
            "Entitlement token that lets a client subscribe to the meta-subjects under "
            "/migratory/ (push monitoring); empty: nobody may, and nothing is pushed. No "
            "client may publish under /migratory/."),
    Setting("MonitorPushInterval", "monitor_push_interval", _int(1, 3600, " of seconds"), "1",
            "Seconds between two publications of the meta-subjects /migratory/stats/<member> "
            "and /migratory/cluster (when MonitorToken is set); at most 2 keeps the dashboard "
            "at /dashboard updating at least every 2 s."),
    Setting("LogFormat", "log_format", _choice("text", "json"), "text",
            "text: one readable line per event; json: one JSON object per line (time, level, "
            "logger, message, and client, peer, connection_id when the line is about a "
            "client)."),
    Setting("AuditLogFile", "audit_log_file", _text, "",
            "File the audit events are appended to as JSON lines (rotated, see "
            "AuditLogMaxBytes); needed when an Audit category is on. With Workers > 1 "
            "every worker appends to it, and they rotate it as one under a lock on "
            "<AuditLogFile>.lock (docs/monitoring.md)."),
    Setting("AuditAccess", "audit_access", _bool, "false",
            "Audit access events: connect (allowed or denied), disconnect with its reason, "
            "subscribe allowed or denied."),
    Setting("AuditMessage", "audit_message", _bool, "false",
            "Audit message events: every publish accepted or refused (subject, size, status)."),
    Setting("AuditCache", "audit_cache", _bool, "false",
            "Audit cache events: cached messages expired, resumes served from the cache (sync) "
            "or with the snapshot (resync)."),
    Setting("AuditLogMaxBytes", "audit_log_max_bytes", _int(1024, unit=" of bytes"),
            "104857600",
            "The audit file is rotated (renamed .1, .2, ...) when it reaches this many bytes."),
    Setting("AuditLogBackups", "audit_log_backups", _int(1, 1000, " of files"), "5",
            "Rotated audit files kept; older ones are deleted."),
)


def check_monitoring(config: ConfigFields, key: Callable[[str], str]) -> None:
    """Rules between the monitoring keys; ConfigError naming the key otherwise."""
    if bool(config.monitor_user) != bool(config.monitor_password):
        missing = "MonitorPassword" if config.monitor_user else "MonitorUser"
        given = "MonitorUser" if config.monitor_user else "MonitorPassword"
        raise ConfigError(f"{key(given)} is set: {missing} is required too (basic auth)")
    if config.monitor_user and config.monitor_listen is None:
        raise ConfigError(
            f"{key('MonitorUser')} is set but MonitorListen is empty (basic authentication "
            "protects the monitoring listener only)"
        )
    if config.monitor_encrypted and config.monitor_listen is None:
        raise ConfigError(f"{key('MonitorEncrypted')} is on but MonitorListen is empty")
    if ":" in config.monitor_user:
        raise ConfigError(f"{key('MonitorUser')}: a basic-auth user name cannot contain ':'")
    categories = [
        name for name, on in (
            ("AuditAccess", config.audit_access),
            ("AuditMessage", config.audit_message),
            ("AuditCache", config.audit_cache),
        ) if on
    ]
    if categories and not config.audit_log_file.strip():
        raise ConfigError(f"{key(categories[0])} is on: AuditLogFile is required")
    if config.audit_log_file.strip() and not categories:
        raise ConfigError(
            f"{key('AuditLogFile')} is set but no audit category is on (AuditAccess, "
            "AuditMessage, AuditCache)"
        )
    listen = config.monitor_listen
    if listen is not None and listen[1] != 0 and listen in config.listen:
        raise ConfigError(
            f"{key('MonitorListen')} {listen[0]}:{listen[1]} is also a client listener (Listen)"
        )
