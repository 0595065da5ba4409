"""The server list: ``"WEIGHT URL"`` entries and the weighted random choice among them.

Pure: no I/O; the random source is injected so tests are deterministic.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["DEFAULT_WEIGHT", "ServerEntry", "choose_server", "parse_server", "parse_servers"]

DEFAULT_WEIGHT = 100
_SCHEMES = ("ws", "wss")


@dataclass(frozen=True, slots=True)
class ServerEntry:
    """One server the client may connect to, and its share of the connections."""

    url: str
    weight: int = DEFAULT_WEIGHT

    def __str__(self) -> str:
        return f"{self.weight} {self.url}"


def parse_server(entry: str) -> ServerEntry:
    """Parse ``"ws://host:port"`` or ``"WEIGHT ws://host:port"``; ValueError names the entry."""
    parts = entry.split() if isinstance(entry, str) else None
    if not parts or len(parts) > 2:
        raise ValueError(f"server entry {entry!r}: expected 'URL' or 'WEIGHT URL'")
    weight = DEFAULT_WEIGHT
    if len(parts) == 2:
        weight_text, url = parts
        if not (weight_text.isascii() and weight_text.isdigit()):  # "²".isdigit() too
            raise ValueError(f"server entry {entry!r}: weight must be a non-negative integer")
        weight = int(weight_text)
    else:
        url = parts[0]
    _check_url(entry, url)
    return ServerEntry(url, weight)


def _check_url(entry: str, url: str) -> None:
    try:
        split = urlsplit(url)
        split.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ValueError(f"server entry {entry!r}: bad URL ({exc})") from None
    if split.scheme not in _SCHEMES:
        raise ValueError(f"server entry {entry!r}: URL scheme must be ws:// or wss://")
    if not split.hostname:
        raise ValueError(f"server entry {entry!r}: URL has no host")
    if split.fragment or url.endswith("#"):
        raise ValueError(f"server entry {entry!r}: a WebSocket URL has no #fragment")


def _same_server(url: str) -> tuple[str, str, int, str]:
    """What two spellings of one server share: ``ws://A:80`` is ``ws://a/``."""
    split = urlsplit(url)
    port = split.port or (443 if split.scheme == "wss" else 80)
    resource = (split.path or "/") + (f"?{split.query}" if split.query else "")
    return split.scheme, split.hostname or "", port, resource


def parse_servers(entries: Iterable[str] | str) -> tuple[ServerEntry, ...]:
    """Parse a server list (a single string counts as one entry); a server listed twice,
    however spelled (``ws://a`` and ``ws://A:80/``: its share would double), is refused."""
    if isinstance(entries, str):
        entries = [entries]
    servers = tuple(parse_server(entry) for entry in entries)
    if not servers:
        raise ValueError("the server list is empty")
    seen: dict[tuple[str, str, int, str], ServerEntry] = {}
    for server in servers:
        first = seen.setdefault(_same_server(server.url), server)
        if first is not server:
            raise ValueError(f"server entry {str(server)!r}: URL listed twice ({first.url!r})")
    return servers


def choose_server(
    servers: Sequence[ServerEntry], rng: random.Random, avoid: ServerEntry | None = None
) -> ServerEntry:
    """Weighted random choice, preferring any server other than ``avoid`` (the one that failed).

    Servers of weight 0 are chosen only when every candidate has weight 0.
    """
    if not servers:
        raise ValueError("the server list is empty")
    candidates = [s for s in servers if s != avoid] or list(servers)
    weights = [s.weight for s in candidates]
    if sum(weights) == 0:
        return rng.choice(candidates)
    return rng.choices(candidates, weights=weights, k=1)[0]
