"""Config key of worker processes: ``Workers`` (docs/workers.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from migratory.config_values import ConfigError, Setting, _int

if TYPE_CHECKING:
    from migratory.config import Config

MAX_WORKERS = 256

WORKER_SETTINGS: tuple[Setting, ...] = (
    Setting("Workers", "workers", _int(1, MAX_WORKERS, " of processes"), "1",
            "Server processes sharing each client listening port (SO_REUSEPORT, Linux); "
            "above 1 a supervising process numbers every message once and the workers serve "
            "clients, each a replica of the one stream, so positions and resume are the same "
            "whichever worker a client lands on (docs/workers.md). A crashed worker is "
            "restarted. Not with ClusterMembers (a cluster member runs one process)."),
)


def check_workers(config: Config, key: Callable[[str], str]) -> None:
    """Rules between Workers and other keys; ConfigError naming the key otherwise."""
    if config.workers > 1 and config.clustered:
        raise ConfigError(
            f"{key('Workers')} = {config.workers} with ClusterMembers: a cluster member runs "
            "one process (Workers = 1); run more members instead (docs/workers.md)"
        )
