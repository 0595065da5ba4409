"""A member stopped as Kubernetes stops a pod (SIGTERM: scale-down, rolling restart)
drains: its SDK subscribers move to other members and resume with DATA_SYNC (never
DATA_RESYNC), its SDK publishers get an outcome for every publish (none left unknown),
and no acknowledged publish is lost."""

from __future__ import annotations

import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
from cluster_fixture import LocalCluster

from migratory.model.message import MessageType
from migratory.model.position import Position
from migratory.server.drain import REFUSED
from migratory_client import (
    Client,
    NotificationStatus,
    PublishOutcomeUnknown,
    ReconnectPolicy,
    connect,
)

SUBJECT = "/Elastic/Drain/A"
FAST = ReconnectPolicy(initial_delay=0.05, max_delay=0.3, connect_timeout=3.0)
NON_SEED, SEED = 3, 2


@dataclass
class Subscriber:
    home: int
    received: list[tuple[bytes, MessageType, Position]] = field(default_factory=list)
    statuses: list[NotificationStatus] = field(default_factory=list)


@dataclass
class Publishing:
    acked: dict[bytes, Position] = field(default_factory=dict)
    refused_draining: int = 0
    failed: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def servers(cluster: LocalCluster, home: int) -> list[str]:
    return [f"{100 if i == home else 1} {cluster.url(i)}" for i in range(cluster.members)]


async def subscribe(
    cluster: LocalCluster,
    sub: Subscriber,
    seed: int,
    stop: trio.Event,
    clients: list[Client] | None = None,
) -> None:
    async with (
        connect(servers(cluster, sub.home), reconnect=FAST, rng=random.Random(seed)) as client,
        client.subscribe(SUBJECT) as subscription,
        trio.open_nursery() as nursery,
    ):
        if clients is not None:
            clients.append(client)

        async def notes() -> None:
            async for note in client.notifications():
                sub.statuses.append(note.status)

        nursery.start_soon(notes)
        while not stop.is_set():
            with trio.move_on_after(0.2):
                message = await subscription.__anext__()
                sub.received.append((message.content, message.type, message.position))
        nursery.cancel_scope.cancel()


async def publish_until(client: Client, name: str, out: Publishing, until: float) -> None:
    """Publish numbered messages; one refused by a draining member is published again."""
    number = 0
    while trio.current_time() < until:
        content = f"{name}-{number:05d}".encode()
        try:
            result = await client.publish(SUBJECT, content, timeout=15)
        except PublishOutcomeUnknown as exc:
            out.unknown.append(f"{content!r}: {exc}")
            number += 1
            continue
        if result.ok:
            assert result.position is not None
            out.acked[content] = result.position
            number += 1
        elif result.reason == REFUSED or "DRAINED" in (result.reason or ""):
            out.refused_draining += 1  # definite: not published; publish it again
        else:
            out.failed.append(f"{content!r}: {result.reason}")
            number += 1
        await trio.sleep(0.005)


def sigterm(cluster: LocalCluster, index: int, exits: dict[int, tuple[int, float]]) -> None:
    process = cluster.processes[index]
    assert process is not None
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    exits[index] = (process.wait(40), time.monotonic() - started)


def run_disruption(tmp_path: Path, victim: int, *, scale_down_first: bool) -> None:
    """Under publish load (three SDK publishers, three publishes in flight each) and six
    SDK subscribers (three on ``victim``): SIGTERM ``victim`` as the kubelet does, start
    it again; with ``scale_down_first`` it is first removed and added back (HPA)."""
    cluster = LocalCluster(tmp_path, members=4, seeds=3)
    cluster.start_all()
    others = [i for i in range(4) if i != victim]
    subscribers = [Subscriber(home) for home in (victim, victim, victim, *others)]
    publishing = Publishing()
    exits: list[tuple[int, float]] = []
    try:
        cluster.wait_ready()

        async def stop_and_start() -> None:
            outcome: dict[int, tuple[int, float]] = {}
            await trio.to_thread.run_sync(sigterm, cluster, victim, outcome)
            exits.append(outcome[victim])
            cluster.start(victim)
            await trio.to_thread.run_sync(cluster.wait_ready, [victim], 60)

        async def disrupt() -> None:
            await trio.sleep(2)
            if scale_down_first:  # the HPA removes the highest ordinal, then adds it back
                await stop_and_start()
                await trio.sleep(1)
            await stop_and_start()  # a rolling restart

        async def main() -> None:
            stop = trio.Event()
            async with trio.open_nursery() as subs:
                for n, sub in enumerate(subscribers):
                    subs.start_soon(subscribe, cluster, sub, n, stop)
                await trio.sleep(1.0)
                async with trio.open_nursery() as clients:
                    async with trio.open_nursery() as load:
                        until = trio.current_time() + (10 if scale_down_first else 7)
                        for home in (victim, *others[:2]):
                            client = await clients.start(_client, servers(cluster, home))
                            for task in range(3):  # several publishes in flight per client
                                load.start_soon(
                                    publish_until, client, f"p{home}{task}", publishing, until
                                )
                        load.start_soon(disrupt)
                    clients.cancel_scope.cancel()
                with trio.move_on_after(30):
                    while not all(_has_all(sub, publishing) for sub in subscribers):
                        await trio.sleep(0.2)
                stop.set()

        trio.run(main)
        for i in range(cluster.members):  # shown when an assertion below fails
            print(f"member {i}:", cluster.status(i))
    finally:
        cluster.stop()
        time.sleep(0.1)

    for code, _seconds in exits:
        assert code == 0, cluster.log(victim)
    # each drain ended because its clients left and its publishes settled, not by
    # DrainTime (30 s): the member's own drain line says which, whatever the box's speed
    drains = [line for line in cluster.log(victim).splitlines() if "drained in" in line]
    assert len(drains) >= len(exits)
    assert [d for d in drains if "DrainTime reached" in d] == [], drains
    assert not publishing.unknown, publishing.unknown[:5]
    assert len(publishing.acked) > 100
    for sub in subscribers:
        contents = [c for c, kind, _ in sub.received if kind is not MessageType.SNAPSHOT]
        positions = [p for c, kind, p in sub.received if kind is not MessageType.SNAPSHOT]
        assert len(contents) == len(set(contents)), "a message delivered twice"
        assert positions == sorted(positions), "delivered out of order"
        assert len({p.epoch for p in positions}) == 1
        seqs = [p.seq for p in positions]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a gap in the delivery"
        missing = set(publishing.acked) - set(contents)
        assert not missing, (
            f"home {sub.home}: {len(missing)} acknowledged publishes lost: "
            f"{sorted((publishing.acked[c], c) for c in missing)[:5]}; received "
            f"{len(contents)} up to {positions[-1] if positions else None}; {sub.statuses}"
        )
        assert NotificationStatus.DATA_RESYNC not in sub.statuses, sub.statuses
        if sub.home == victim:
            assert NotificationStatus.SERVER_DOWN in sub.statuses, sub.statuses
            assert NotificationStatus.DATA_SYNC in sub.statuses, sub.statuses


@pytest.mark.slow
def test_non_seed_scaled_down_up_and_restarted_under_load(tmp_path: Path) -> None:
    run_disruption(tmp_path, NON_SEED, scale_down_first=True)


@pytest.mark.slow
def test_seed_restarted_under_load(tmp_path: Path) -> None:
    run_disruption(tmp_path, SEED, scale_down_first=False)


async def _client(
    servers: list[str], *, task_status: trio.TaskStatus[Client] = trio.TASK_STATUS_IGNORED
) -> None:
    async with connect(servers, reconnect=FAST, rng=random.Random(0)) as client:
        await client.wait_connected()
        task_status.started(client)
        await trio.sleep_forever()


def _has_all(sub: Subscriber, publishing: Publishing) -> bool:
    return set(publishing.acked) <= {c for c, _, _ in sub.received}

