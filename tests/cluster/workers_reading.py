"""Reading what the Workers tests' native subscribers get: a wait that ends without
it says which stage, how much came and which messages are missing -- not a bare
timeout (a CI failure cut off after ``_queue.Empty`` could not tell which wait it was)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from rawclient import RawClient, delivered

from migratory.model.message import Message, MessageType


def missing_text(wanted: Iterable[bytes], got: Iterable[bytes]) -> str:
    have = set(got)
    missing = [w for w in wanted if w not in have]
    shown = b", ".join(missing[:12]).decode() + (" ..." if len(missing) > 12 else "")
    return f"{len(missing)} missing: {shown}"


def next_updates(client: RawClient, so_far: Callable[[], str]) -> list[Message]:
    """The updates of the next operation; none in 10 s (or the connection gone) fails,
    saying ``so_far()`` -- what came and what is missing -- not a bare timeout."""
    try:
        op = client.recv_op(timeout=10)
    except (OSError, AssertionError) as exc:
        raise AssertionError(f"{so_far()}; then {type(exc).__name__}: {exc}") from None
    return [m for m in delivered([op]) if m.type is not MessageType.SNAPSHOT]


def updates(client: RawClient, count: int, stage: str = "updates") -> list[Message]:
    got: list[Message] = []

    def so_far() -> str:
        return f"{stage}: {len(got)} of {count} came"

    while len(got) < count:
        got += next_updates(client, so_far)
    return got


def updates_until(client: RawClient, contents: Iterable[bytes], stage: str) -> list[Message]:
    """Updates until every one of ``contents`` has come."""
    wanted, got = list(contents), []

    def so_far() -> str:
        return f"{stage}: {missing_text(wanted, [m.content for m in got])}"

    while not set(wanted) <= {m.content for m in got}:
        got += next_updates(client, so_far)
    return got
