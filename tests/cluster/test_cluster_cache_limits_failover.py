"""Subscribers on the Raft leader, 200 subjects, a tiny cache (CacheMemoryBudget ~30
messages, MaxCachedMessagesPerSubject 2): the leader is SIGKILLed under publish load and
the subscribers resume on the followers, from positions the cache there may have dropped.
Each subject's messages come in order, none twice, and any jump past a missed message
follows a DATA_RESYNC of that subject: never a silent gap. No member logs a Traceback;
only the killed one has exited."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio
from cluster_fixture import LocalCluster
from steady_load import FAST

from migratory.model.message import MessageType
from migratory_client import NotificationStatus, connect

SUBJECTS = [f"/Limits/Cache/S{i}" for i in range(200)]
BUDGET = 30 * 300  # bytes: ~30 small cached messages of the 200 subjects' 400
RATE = 1000  # publishes a second, round the subjects
LOAD_SECONDS = 3.0
KILL_AT = 1.0


@pytest.mark.slow
def test_subscribers_of_a_killed_leader_resume_past_a_tiny_cache_without_a_silent_gap(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path, members=3, CacheMemoryBudget=str(BUDGET),
                           MaxCachedMessagesPerSubject="2")
    cluster.start_all()
    acked: dict[str, set[int]] = {s: set() for s in SUBJECTS}
    events: list[tuple[str, str, int]] = []  # (kind, subject, seq): message/snapshot/resync
    notes: list[NotificationStatus] = []
    errors: list[str] = []
    try:
        cluster.wait_ready()
        leader = cluster.leader()
        publishing = next(i for i in range(3) if i != leader)
        servers = [f"{100 if i == leader else 1} {cluster.url(i)}" for i in range(3)]

        async def subscriber(stop: trio.Event) -> None:
            async with (
                connect(servers, reconnect=FAST, rng=random.Random(3)) as client,
                client.subscribe(*SUBJECTS) as subscription,
                trio.open_nursery() as nursery,
            ):
                async def watch() -> None:
                    async for note in client.notifications():
                        notes.append(note.status)
                        if note.status is NotificationStatus.DATA_RESYNC and note.subject:
                            events.append(("resync", note.subject, 0))

                nursery.start_soon(watch)
                while not stop.is_set():
                    with trio.move_on_after(0.2):
                        m = await subscription.__anext__()
                        kind = "snapshot" if m.type is MessageType.SNAPSHOT else "message"
                        events.append((kind, m.subject, m.position.seq))
                nursery.cancel_scope.cancel()

        async def publisher(until: float) -> None:
            async with connect([cluster.url(publishing)], reconnect=FAST) as client:
                async def one(subject: str, n: int) -> None:
                    try:
                        result = await client.publish(subject, f"m{n}".encode(), timeout=20)
                    except Exception as error:  # recorded, asserted below
                        errors.append(repr(error))
                        return
                    if result.ok:
                        assert result.position is not None
                        acked[subject].add(result.position.seq)

                async with trio.open_nursery() as nursery:
                    n = 0
                    while trio.current_time() < until:
                        nursery.start_soon(one, SUBJECTS[n % len(SUBJECTS)], n)
                        n += 1
                        await trio.sleep(1 / RATE)

        def caught_up() -> bool:
            last: dict[str, int] = {}
            for kind, subject, seq in events:
                if kind != "resync":
                    last[subject] = seq
            return all(not seqs or last.get(s, 0) >= max(seqs) for s, seqs in acked.items())

        async def main() -> None:
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(subscriber, stop)
                with trio.fail_after(20):
                    while notes.count(NotificationStatus.SUBSCRIBE_ALLOW) < len(SUBJECTS):
                        await trio.sleep(0.05)
                async with trio.open_nursery() as load:
                    load.start_soon(publisher, trio.current_time() + LOAD_SECONDS)
                    await trio.sleep(KILL_AT)
                    await trio.to_thread.run_sync(cluster.kill, leader)
                with trio.fail_after(30):
                    while not caught_up():
                        await trio.sleep(0.1)
                stop.set()

        trio.run(main)
        exited = cluster.exited()
        logs = {i: cluster.log(i) for i in range(3)}
    finally:
        cluster.stop()
    silent: list[str] = []
    missed = resyncs = 0
    last: dict[str, int] = {}
    resynced: set[str] = set()
    for kind, subject, seq in events:
        if kind == "resync":
            resyncs += 1
            resynced.add(subject)
            continue
        before = last.get(subject, 0)
        if kind == "message":
            if seq <= before:
                silent.append(f"{subject}: {seq} after {before} (again/out of order)")
            elif seq > before + 1:
                missed += seq - before - 1
                if subject not in resynced:
                    silent.append(f"{subject}: {seq} after {before} without DATA_RESYNC")
        last[subject] = max(before, seq)
        resynced.discard(subject)
    figures = (f"leader {leader} killed; {sum(map(len, acked.values()))} acknowledged, "
               f"errors {len(errors)} {errors[:3]}; {len(events)} events, {resyncs} "
               f"DATA_RESYNC, {missed} skipped after one; notes "
               f"{ {n.value: notes.count(n) for n in set(notes)} }")
    print(figures)
    assert exited == {leader: -9}, figures
    assert not silent, f"{figures}\n{silent[:20]}"
    for i, text in logs.items():
        assert "Traceback" not in text, f"member {i}:\n{text[-3000:]}"
