"""The one validated configuration object.

Sources, later ones winning: built-in defaults, a config file in the MigratoryData
``Key = Value`` style, environment variables ``MIGRATORY_CFG_<KEY>`` (key matched
case-insensitively), and ``--set Key=Value`` on the command line. All sources are
merged first, then every value is parsed and the rules between keys are checked once,
on the merged result (so the file may list the members and the environment say which
one this is). An unknown key or a bad value stops start-up with a message naming the
key and where it came from.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from migratory.config_cluster import CLUSTER_SETTINGS, check_cluster, expand_member_template
from migratory.config_fields import ConfigFields
from migratory.config_file import COMMENT_HINT, FILE_FORMAT, Layer
from migratory.config_file import parse_config_text as parse_config_text  # re-exported
from migratory.config_file import read_config_file as read_config_file  # re-exported
from migratory.config_keepalive import KEEPALIVE_SETTINGS
from migratory.config_listeners import LISTENER_SETTINGS, check_listener_clash, check_listeners
from migratory.config_monitoring import MONITOR_SETTINGS, check_monitoring
from migratory.config_mqtt import MQTT_SESSION_SETTINGS, check_mqtt_sessions
from migratory.config_security import ENTITLEMENT_SETTINGS, LIMIT_SETTINGS, check_cluster_tls
from migratory.config_sizes import LINKED_MAX_FRAME_SIZE, MAX_MESSAGE_SIZE, check_sizes
from migratory.config_values import ConfigError as ConfigError  # re-exported
from migratory.config_values import (
    Setting,
    _addresses,
    _bool,
    _choice,
    _gc_thresholds,
    _int,
    _optional_addresses,
    _text,
    clipped,
    shown,
)
from migratory.config_workers import WORKER_SETTINGS, check_workers

ENV_PREFIX = "MIGRATORY_CFG_"


SETTINGS: tuple[Setting, ...] = (
    Setting("Listen", "listen", _addresses, "127.0.0.1:8800",
            "Comma-separated host:port addresses for WebSocket and HTTP clients; port 0 picks "
            "a free port (printed at start)."),
    Setting("ListenMqtt", "listen_mqtt", _optional_addresses, "",
            "Comma-separated host:port addresses for MQTT 3.1.1 clients over TCP (see "
            "docs/mqtt.md; MQTT over WebSocket needs no key: subprotocol `mqtt` on a Listen "
            "port); empty: no MQTT listener; port 0 picks a free port (printed at start)."),
    Setting("ListenMqttEncrypted", "listen_mqtt_encrypted", _optional_addresses, "",
            "Comma-separated host:port addresses for MQTT 3.1.1 over TLS (mqtts://, usually "
            "port 8883); needs TlsCertificate and TlsKey like ListenEncrypted (and TlsClientCa "
            "for mutual TLS)."),
    *MQTT_SESSION_SETTINGS,
    *LISTENER_SETTINGS,
    Setting("ServerName", "server_name", _text, "migratory",
            "Name sent to clients in `connected` and used in logs."),
    Setting("LogLevel", "log_level", _choice("DEBUG", "INFO", "WARNING", "ERROR"), "INFO",
            "Logging threshold."),
    Setting("Entitlement", "entitlement", _choice("None", "Basic", "Token", "Custom"), "None",
            "None: anyone may connect, subscribe and publish. Basic: anyone may subscribe; only "
            "clients whose token equals EntitlementAllowToken may publish. Token: a JWT lists "
            "the subjects a client may subscribe to and publish on. Custom: a Python plugin "
            "(EntitlementPlugin). See docs/security.md."),
    Setting("EntitlementAllowToken", "entitlement_allow_token", _text, "",
            "The publishing token for Entitlement = Basic (required then)."),
    *ENTITLEMENT_SETTINGS,
    Setting("PublishSnapshotMessage", "publish_snapshot_message", _bool, "true",
            "Send the subject's snapshot first on every subscribe."),
    Setting("MaxCachedMessagesPerSubject", "max_cached_messages_per_subject",
            _int(0, unit=" of messages"), "1000",
            "Messages kept per subject for recovery and history."),
    Setting("CacheExpireTime", "cache_expire_time", _int(1, unit=" of seconds"), "180",
            "Seconds a cached message is kept at least, unless MaxCachedMessagesPerSubject "
            "or CacheMemoryBudget drops it sooner; older ones are dropped."),
    Setting("CacheMemoryBudget", "cache_memory_budget", _int(0, unit=" of bytes"),
            "268435456",
            "Bytes all subjects' cached messages together may take (their content, subject "
            "and fields, plus 270 bytes of bookkeeping each and 64 for each field name "
            "and value: about the memory they use); "
            "past it the oldest cached messages are dropped first, whatever their subject "
            "and age, and a client resuming from one gets the snapshot and DATA_RESYNC. A "
            "Guaranteed seed holds two caches of this size (its own and the Raft state's). "
            "0: no budget."),
    Setting("BatchTime", "batch_time", _int(0, 10_000, " of milliseconds"), "10",
            "Milliseconds messages wait to be written together to a client (0: write at once)."),
    Setting("BatchIdleWrite", "batch_idle_write", _bool, "true",
            "Write at once to a client that has had nothing written for a BatchTime; only "
            "clients written to within the last BatchTime wait for the next batch (false: "
            "every message waits for the batch tick)."),
    Setting("EncryptedBatchTime", "encrypted_batch_time", _int(0, 10_000, " of milliseconds"),
            "0",
            "BatchTime (milliseconds) for the clients of encrypted listeners (ListenEncrypted, "
            "MQTT over TLS), rounded to a whole number of BatchTime ticks; 0 or at most "
            "BatchTime: the same as the others. A TLS record costs ~4 us of CPU on each side "
            "whatever it carries: 20 (with BatchTime 10) cut the server's CPU per TLS "
            "delivery by 13-15 % at 100,000 deliveries/s for 2-4 ms more at the median, p99 "
            "unchanged (docs/tls.md). An idle client is still written at once (BatchIdleWrite)."),
    Setting("SendPath", "send_path", _choice("socket", "io_uring"), "socket",
            "How batches are written to clients. socket: a non-blocking send() on the event "
            "loop's thread. io_uring (Linux 5.19+, x86-64): each write goes to the kernel's "
            "io-wq worker threads (IOSQE_ASYNC), so the send's kernel work (~7-10 us a write) "
            "runs on another core and the loop thread keeps ~2-3 us of it; it pays when one "
            "core is the limit and another has room (many subjects at high rates), and costs "
            "a few us more per write when the server is not busy. Above 30,000 writes/s the "
            "writes of up to 10 ms go to the kernel together (a write waits at most that "
            "long); below, each at once. TLS clients keep send(). "
            "Where io_uring is refused (Docker's default seccomp profile, "
            "kernel.io_uring_disabled) the server logs a warning and uses send(). See "
            "docs/benchmarks.md, \"io_uring without a polling core\"."),
    Setting("MaxBatchingSpace", "max_batching_space", _int(1, unit=" of bytes"), "65536",
            "A client's batch is written as soon as it holds this many bytes."),
    Setting("MaxMessageSize", "max_message_size", _int(1, MAX_MESSAGE_SIZE, unit=" of bytes"),
            "131072",
            "Largest content + subject + fields of a publish, in bytes; larger ones get "
            f"MESSAGE_SIZE_LIMIT_EXCEEDED. At most {MAX_MESSAGE_SIZE} (what an MQTT PUBLISH "
            "carries). "
            "A conflated message stays within it too: when a "
            "message's fields would make the union of a period's fields pass it, the union "
            "starts again from that message's fields. Equal on every cluster member (members "
            "that differ refuse to link; docs/cluster.md, \"Members must agree\")."),
    Setting("MaxFrameSize", "max_frame_size", _int(1024, unit=" of bytes"), "1048576",
            "Largest WebSocket message or MQTT packet a client may send, in bytes; larger "
            "ones close the connection (WebSocket: 1009). Equal on every cluster member, as "
            f"MaxMessageSize. With ClusterMembers or Workers > 1, at most {LINKED_MAX_FRAME_SIZE} "
            "(15.7 MiB): a link frame (64 MiB at most) holds two of the largest publishes "
            "at twice this each, and 1 MiB (docs/cluster.md, Bounds)."),
    Setting("ClientMaxPendingBytes", "client_max_pending_bytes", _int(1024, unit=" of bytes"),
            "4194304",
            "Bytes queued for a client that does not read before it is cut off as a slow "
            "consumer (close 4500). At least 2 x MaxMessageSize (room for the largest "
            "message, encoded)."),
    Setting("HandshakeTimeout", "handshake_timeout", _int(1, unit=" of seconds"), "10",
            "Seconds a new connection has to finish the HTTP/WebSocket handshake and `connect`; "
            "an HTTP keep-alive connection is closed after this long idle (docs/http.md)."),
    Setting("GcThresholds", "gc_thresholds", _gc_thresholds, "20000,2,200",
            "Python's garbage-collector thresholds (gen0 allocations, gen1, gen2 collections; "
            "Python's own default is 700,10,10). A high gen0 x gen2 product keeps full "
            "collections -- which stop the server for tens of ms on a large heap (~190 ms at "
            "10,000 connections) -- minutes apart; a low gen1 keeps the middle generation "
            "small (20000,20,20 let it reach 400,000 objects: 90 ms pauses while 200,000 "
            "subjects were created). Besides, a ready server that received, published and "
            "fanned out nothing for a whole second runs the full collection Python has "
            "pending then, not later under load (`gc.idle_collections` in `/stats`; "
            "`migratory/server/gc_pauses.py`); a cluster member not ready (taking a cache "
            "sync), or a seed whose Raft node takes entries, is not idle."),
    Setting("DrainTime", "drain_time", _int(0, unit=" of seconds"), "30",
            "On SIGTERM the server drains: no new clients, publishes settled, every client "
            "told to reconnect elsewhere (close 4502 DRAINED); it stops once they have left "
            "and every publish taken has its answer (HTTP ones too), or after this many "
            "seconds (SIGINT, Ctrl-C, stops at once, during a drain too). On Kubernetes keep "
            "it below terminationGracePeriodSeconds minus the preStop sleep."),
    *KEEPALIVE_SETTINGS,
    *LIMIT_SETTINGS,
    *WORKER_SETTINGS,
    *CLUSTER_SETTINGS,
    *MONITOR_SETTINGS,
)
_BY_KEY = {s.key: s for s in SETTINGS}
_BY_LOWER = {s.key.lower(): s for s in SETTINGS}


@dataclass(frozen=True, slots=True)
class Config(ConfigFields):
    """The checked configuration: :class:`ConfigFields` built from the settings' layers."""

    @classmethod
    def defaults(cls) -> Config:
        return cls.from_mapping({})

    @classmethod
    def from_mapping(cls, values: Mapping[str, str], *, source: str = "setting") -> Config:
        """Build from ``Key -> text`` over the defaults; keys are exact."""
        return build_config([Layer(source, values)])

    def as_text(self) -> dict[str, str]:
        """Each key's effective value, formatted as it would be written in a file."""
        out = {}
        for setting in SETTINGS:
            value = getattr(self, setting.attr)
            derived = {"cluster_members": bool(self.cluster_member_template),
                       "cluster_member_listen": self.cluster_member_ordinal is not None}
            if value is None or derived.get(setting.attr):  # unset, or from the template
                out[setting.key] = ""
            elif setting.attr in (
                "listen", "listen_mqtt", "listen_mqtt_encrypted", "listen_encrypted",
                "cluster_members",
            ):
                out[setting.key] = ", ".join(f"{h}:{p}" for h, p in value)
            elif setting.attr in ("cluster_member_listen", "cluster_member_bind", "monitor_listen"):
                out[setting.key] = f"{value[0]}:{value[1]}"
            elif setting.attr in ("cluster_seed_member_count", "cluster_member_count"):
                out[setting.key] = str(value) if value else ""
            elif isinstance(value, bool):
                out[setting.key] = str(value).lower()
            elif setting.attr == "listener_roles":
                out[setting.key] = "; ".join(role.as_text() for role in value)
            elif setting.attr == "http_cors_origins":
                out[setting.key] = ", ".join(value)
            elif setting.attr in ("gc_thresholds", "publish_allow_from_address_list",
                                  "client_tcp_keepalive"):
                out[setting.key] = ",".join(str(v) for v in value)
            else:
                out[setting.key] = str(value)
        return out


def _known_key(key: str, source: str) -> str:
    if key in _BY_KEY:
        return key
    hint = difflib.get_close_matches(key, list(_BY_KEY), n=1)
    if not hint and key.lower() in _BY_LOWER:
        hint = [_BY_LOWER[key.lower()].key]
    suffix = f" (did you mean {hint[0]!r}?)" if hint else ""
    raise ConfigError(f"{source}: unknown key {shown(key)}{suffix}")


def _parse(setting: Setting, text: str, source: str) -> Any:
    try:
        return setting.parse(text.strip())
    except ValueError as exc:
        hint = COMMENT_HINT if "#" in text else ""
        bare = text.strip()
        if len(bare) > 1 and bare[0] == bare[-1] and bare[0] in "'\"":  # Listen = "a:1"
            hint = f" (a value is not quoted: {setting.key} = {bare[1:-1]})"
        raise ConfigError(f"{source}: {setting.key}: {clipped(str(exc), text)}{hint}") from None


class _Origins:
    """Where each key's effective value came from, to name it in cross-key errors."""

    def __init__(self, sources: Mapping[str, str]) -> None:
        self._sources = sources

    def __call__(self, key: str) -> str:
        source = self._sources.get(key)
        return key if source is None else f"{key} (from {source})"


def build_config(layers: Iterable[Layer]) -> Config:
    """Merge the layers over the defaults (later wins), then parse and check once."""
    raw = {s.key: s.default for s in SETTINGS}
    sources: dict[str, str] = {}
    for layer in layers:
        for key, text in layer.values.items():
            known = _known_key(key, layer.place(key))
            raw[known] = text
            sources[known] = layer.place(key)
    values = {
        _BY_KEY[key].attr: _parse(_BY_KEY[key], text, sources.get(key, "default"))
        for key, text in raw.items()
    }
    return _check(Config(**values), _Origins(sources))


def _check(config: Config, key: _Origins) -> Config:
    """Rules that involve more than one key, checked once on the merged settings."""
    config = check_cluster(expand_member_template(config, key), key)
    check_listeners(config, key)
    check_monitoring(config, key)
    check_workers(config, key)
    check_cluster_tls(config, key)
    check_mqtt_sessions(config, key)
    if config.entitlement == "Basic" and not config.entitlement_allow_token:
        raise ConfigError(
            f"{key('Entitlement')} = Basic needs {key('EntitlementAllowToken')} "
            "(the publishing token)"
        )
    check_listener_clash(config, key)
    if config.entitlement == "Token" and (
        bool(config.entitlement_token_key_file) == bool(config.entitlement_token_jwks_file)
    ):
        raise ConfigError(
            f"{key('Entitlement')} = Token needs exactly one of "
            f"{key('EntitlementTokenKeyFile')} and {key('EntitlementTokenJwksFile')}"
        )
    if config.entitlement == "Custom" and not config.entitlement_plugin:
        raise ConfigError(
            f"{key('Entitlement')} = Custom needs {key('EntitlementPlugin')} (module:Class)"
        )
    check_sizes(config, key)
    return config


def env_overrides(environ: Mapping[str, str]) -> Layer:
    """``MIGRATORY_CFG_<KEY>`` variables, keys matched case-insensitively; each key's
    place is its variable (``environment variable MIGRATORY_CFG_BATCHTIME``)."""
    values: dict[str, str] = {}
    places: dict[str, str] = {}
    for name, text in environ.items():
        if not name.upper().startswith(ENV_PREFIX):
            continue
        where = f"environment variable {name if name.isprintable() else shown(name)}"
        setting = _BY_LOWER.get(name[len(ENV_PREFIX):].lower())
        if setting is None:
            hint = difflib.get_close_matches(name[len(ENV_PREFIX):].lower(), _BY_LOWER, n=1)
            suffix = f"did you mean {ENV_PREFIX}{_BY_LOWER[hint[0]].key.upper()}?" if hint else (
                "see docs/config.md")
            raise ConfigError(f"{where}: unknown key ({suffix})")
        if setting.key in places:  # MIGRATORY_CFG_BatchTime and MIGRATORY_CFG_BATCHTIME
            raise ConfigError(f"{where}: {setting.key} is set twice (also by "
                              f"{places[setting.key].removeprefix('environment variable ')})")
        values[setting.key], places[setting.key] = text, where
    return Layer("environment", values, places)


def parse_set_options(items: Iterable[str]) -> dict[str, str]:
    values = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set: expected Key=Value, got {shown(item)}")
        values[_known_key(key.strip(), "--set")] = value
    return values


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    overrides: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
    text: str | None = None,
) -> Config:
    """Defaults, then the file, then the environment, then ``overrides`` (``--set``):
    all merged first (later wins), then parsed and checked once. ``text``: the file's
    text, read already (a worker gets its supervisor's, :mod:`cluster.workers`)."""
    layers = []
    if path is not None:
        if text is None:
            text = read_config_file(path)
        layers.append(parse_config_text(text, source=str(path)))
    layers.append(env_overrides(os.environ if environ is None else environ))
    layers.append(Layer("--set", overrides or {}))
    return build_config(layers)


def reference_markdown() -> str:
    """The config reference (docs/config.md is this text; a test keeps them equal)."""
    lines = [
        "# Configuration reference",
        "",
        "Set keys in a file (`migratory serve --config FILE`, lines `Key = Value`, `#` comments),",
        f"in the environment (`{ENV_PREFIX}<KEY>`, case-insensitive, one variable a key), or",
        "with `--set Key=Value`; later sources win. All sources are merged before anything is",
        "checked, so rules between keys apply to the merged result. Unknown keys and bad",
        "values stop start-up with a message naming the key, what it accepts, and where it",
        "was set (`FILE:LINE`, `environment variable MIGRATORY_CFG_...`, `--set`), as does",
        "a number past its key's maximum (2^40 where none is said; seconds: ten years).",
        "", *FILE_FORMAT, "",
        "| Key | Default | Meaning |\n|---|---|---|",
    ]
    lines += [f"| `{s.key}` | `{s.default}` | {s.doc} |" for s in SETTINGS]
    return "\n".join(lines) + "\n"


assert {f.name for f in fields(Config)} == {s.attr for s in SETTINGS}


if __name__ == "__main__":
    print(reference_markdown(), end="")
