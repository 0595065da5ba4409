"""Cluster DNS as the local stand-in answers it (tests/deploy/k8s_local.py ``hosts``):
with a play's ``dns_cache``, the worst a cache may answer, whenever the play turned it
on."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing
from k8s_local import LocalStatefulSet
from k8s_manifests import documents


def test_a_name_younger_than_the_cache_is_answered_as_it_first_was(tmp_path: Path) -> None:
    """Seed 1 created 3 s before a 7.5 s cache is on (a play's fault right after the
    first start), deleted and recreated at a new IP: the others are answered with its
    first IP until 7.5 s after it went, as a cache that got it just before does, then
    the new one. Before, a name younger
    than the cache was answered as it is now: the old IP never, or only later (the
    stale answers of ip-reused, seed-roll-dns and node-drain-two-seeds depended on how
    long the first start had taken)."""
    sts = LocalStatefulSet(documents(), tmp_path, "password")

    def seen(at: str) -> str | None:
        line = next((line for line in sts.hosts().splitlines()
                     if line.endswith(" migratory-1")), None)
        return None if line is None else f"{at}: {line.split()[0]}"

    async def play() -> list[str | None]:
        sts._record("migratory-1", "10.244.0.11")  # the first start
        await trio.sleep(3)
        sts.dns_cache = 7.5  # the play's fault begins
        sts._record("migratory-1", None)
        await trio.sleep(1)
        sts._record("migratory-1", "10.244.0.20")
        answers = [seen("4 s")]
        await trio.sleep(6)
        answers.append(seen("10 s"))
        await trio.sleep(2)
        answers.append(seen("12 s"))
        return answers

    answers = trio.run(play, clock=trio.testing.MockClock(autojump_threshold=0))
    assert answers == ["4 s: 10.244.0.11", "10 s: 10.244.0.11", "12 s: 10.244.0.20"]
