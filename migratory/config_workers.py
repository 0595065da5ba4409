"""Config key of worker processes: ``Workers`` (docs/workers.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from migratory.config_values import ConfigError, Setting, _int

if TYPE_CHECKING:
    from migratory.config_fields import ConfigFields

MAX_WORKERS = 256
BEAT_SECONDS = 0.5
"""How often a worker's event loop tells its supervisor it turns (WorkerHangTime)."""

WORKER_SETTINGS: tuple[Setting, ...] = (
    Setting("Workers", "workers", _int(1, MAX_WORKERS, " of processes"), "1",
            "Server processes sharing each client listening port (SO_REUSEPORT, Linux); "
            "above 1 a supervising process numbers every message once and the workers serve "
            "clients, each a replica of the one stream, so positions and resume are the same "
            "whichever worker a client lands on (docs/workers.md). A crashed worker is "
            "restarted. Not with ClusterMembers (a cluster member runs one process)."),
    Setting("WorkerHangTime", "worker_hang_time", _int(0, unit=" of seconds"), "10",
            "With Workers > 1: a worker whose event loop has sent its supervisor no "
            "heartbeat for this many seconds (hung: an endless loop in a plugin, a stuck "
            "system call, SIGSTOP) is killed and restarted as a crashed one is, so that the "
            "new connections the kernel gives it are not left waiting (docs/workers.md). "
            "0: never; else at least 2."),
)


def check_workers(config: ConfigFields, key: Callable[[str], str]) -> None:
    """Rules between Workers and other keys; ConfigError naming the key otherwise."""
    if config.workers > 1 and config.clustered:
        members = key("ClusterMemberTemplate" if config.cluster_member_template
                      else "ClusterMembers")
        raise ConfigError(
            f"{key('Workers')} = {config.workers} with {members}: a cluster member runs "
            "one process (Workers = 1); run more members instead (docs/workers.md)"
        )
    if config.worker_hang_time == 1:
        raise ConfigError(
            f"{key('WorkerHangTime')} = 1: a worker beats every {BEAT_SECONDS:g} s; give it "
            "at least 2 s, or 0 (never)"
        )
    check_monitor_ports(config, key)


def check_monitor_ports(config: ConfigFields, key: Callable[[str], str]) -> None:
    """With MonitorListen = host:P, worker i answers on P + i: every one of those ports
    must exist and none may be a client listener's (else the server starts, and fails
    when that worker does, naming a port nobody configured)."""
    if config.workers < 2 or config.monitor_listen is None or config.monitor_listen[1] == 0:
        return
    host, first = config.monitor_listen
    last = first + config.workers - 1
    ports = f"{key('MonitorListen')} {host}:{first} with Workers = {config.workers}"
    if last > 65535:
        raise ConfigError(
            f"{ports}: worker i answers on port {first} + i, up to {last}, past 65535; "
            "choose a lower port (or port 0: each worker picks a free one)"
        )
    clients = (*config.listen, *config.listen_encrypted, *config.listen_mqtt,
               *config.listen_mqtt_encrypted)
    for index in range(config.workers):
        if (host, first + index) in clients:
            raise ConfigError(
                f"{ports}: worker {index} would answer on {host}:{first + index}, a client "
                "listener; choose monitoring ports P..P+Workers-1 clear of the client ports"
            )
