"""The load of the rehearsal and the StatefulSet fault plays (rehearsal.under_load), on
trio's mock clock with its clients faked: the publishers start once every subscriber
is subscribed, not after a fixed wait -- sooner on a quiet box, later when a subscribe
takes longer (a publish acknowledged before a subscriber is subscribed is one it would
be blamed for missing)."""

from __future__ import annotations

from typing import Any

import pytest
import rehearsal
import trio
import trio.testing
from rehearsal import Load, Subscriber

from migratory_client import NotificationStatus


def started_at(monkeypatch: pytest.MonkeyPatch, subscribed_after: list[float | None]) -> float:
    """When ``under_load`` started its publishers (mock seconds), with subscriber ``i``
    subscribed ``subscribed_after[i]`` seconds after it started (None: never)."""
    subscribers = [Subscriber() for _ in subscribed_after]
    began: list[float] = []  # each publisher's start
    delays = {id(sub): after for sub, after in zip(subscribers, subscribed_after, strict=True)}

    async def subscriber(sub: Subscriber, stop: trio.Event) -> None:
        after = delays[id(sub)]
        if after is not None:
            await trio.sleep(after)
            sub.statuses.append(NotificationStatus.SUBSCRIBE_ALLOW)
        await stop.wait()

    async def publishing_client(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(object())
        await trio.sleep_forever()

    async def publisher(client: object, name: str, load: Load, stop: trio.Event) -> None:
        began.append(trio.current_time())
        await stop.wait()

    monkeypatch.setattr(rehearsal, "subscriber", subscriber)
    monkeypatch.setattr(rehearsal, "publishing_client", publishing_client)
    monkeypatch.setattr(rehearsal, "publisher", publisher)

    async def body() -> None:  # (after rehearsal.flowing: these publishers publish nothing)
        pass

    async def main() -> None:
        await rehearsal.under_load(subscribers, Load(), body)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(began) == 4 and max(began) - min(began) < 0.01, began  # (two clients' two)
    return began[0]


def test_the_publishers_start_as_soon_as_every_subscriber_is_subscribed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    at = started_at(monkeypatch, [0.3, 0.5, 0.1])
    assert 0.5 <= at < 0.6, at  # was 2.0: a fixed wait


def test_the_publishers_wait_for_a_slow_subscribe(monkeypatch: pytest.MonkeyPatch) -> None:
    at = started_at(monkeypatch, [0.2, 2.5])
    assert at >= 2.5, at  # was 2.0: publishes the second subscriber could not get


def test_a_subscriber_never_subscribed_ends_the_play(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.RaisesGroup(trio.TooSlowError, flatten_subgroups=True):
        started_at(monkeypatch, [0.2, None])
