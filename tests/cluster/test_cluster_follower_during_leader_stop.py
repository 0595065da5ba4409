"""A subscriber on each Raft FOLLOWER seed while the leader stops, under steady publish load
(~150 acknowledged publishes/s through a non-seed): the leader's pod is stopped as
Kubernetes does (SIGTERM: a graceful drain; then started again, as its pod is recreated,
while two non-seeds join and sync from the seeds), or stops answering without leaving
(SIGSTOP for a few seconds, then SIGCONT).

The play ``scale-out-in-leader-restart`` once failed with a subscriber that got nothing
for ~12 s while publishes were acknowledged, then resumed past the cache (DATA_RESYNC);
one reading was a follower that kept a stale leader and commit index, stayed ready while
another seed led and committed, and starved its clients. Here the follower must deliver
every acknowledged publish, none twice, without a DATA_RESYNC; the largest silence the
subscriber saw (the most publishes acknowledged meanwhile: below a quarter of the cache)
and the followers' /readyz over time are printed as the measurement."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import pytest
import trio
from cluster_fixture import LocalCluster
from steady_load import publish_steadily, subscribe_recording

from migratory.model.message import MessageType
from migratory_client import NotificationStatus

SUBJECT = "/Elastic/FollowerLeaderStop/A"
SEEDS = 3
CACHED = 1000  # MaxCachedMessagesPerSubject's default
NON_SEED = 3  # the publisher's member
JOINING = [4, 5]  # non-seeds started as the leader stops (the play's scale-out)
STOPPED_SECONDS = 6.0  # SIGSTOP: the leader answers nothing this long, then resumes


@dataclass
class Seen:
    """One follower seed's subscriber, and the follower's readiness."""

    received: list[tuple[float, int, MessageType, int]] = field(default_factory=list)
    """(time, index of the notification before it, type, seq)"""
    notes: list[NotificationStatus] = field(default_factory=list)
    readiness: list[tuple[float, bool, str]] = field(default_factory=list)


def largest_silence(seen: Seen, acked: list[tuple[float, int]]) -> tuple[float, int]:
    """The silence between two messages the subscriber received in which the most
    publishes were acknowledged: its seconds, and that count."""
    times = sorted(t for t, _, kind, _ in seen.received if kind is not MessageType.SNAPSHOT)
    best = (0.0, 0)
    for a, b in pairwise(times):
        count = sum(1 for t, _ in acked if a < t < b)
        if (count, b - a) > (best[1], best[0]):
            best = (b - a, count)
    return best


def report(seen: Seen, acked: list[tuple[float, int]], start: float) -> str:
    silence, acked_in_it = largest_silence(seen, acked)
    changes = [f"  {t - start:.2f} {'ready' if r else 'NOT ready'} {text}"
               for i, (t, r, text) in enumerate(seen.readiness)
               if i == 0 or (r, text.split(" applied")[0])
               != (seen.readiness[i - 1][1], seen.readiness[i - 1][2].split(" applied")[0])]
    return (f"notes {[n.value for n in seen.notes]}; {len(seen.received)} received; largest "
            f"silence {silence:.2f} s with {acked_in_it} acknowledged in it; readiness:\n"
            + "\n".join(changes))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm", "sigstop"])
def test_subscribers_on_the_follower_seeds_get_every_message_while_the_leader_stops(
    tmp_path: Path, how: str,
) -> None:
    cluster = LocalCluster(tmp_path, members=SEEDS + 1 + len(JOINING), seeds=SEEDS)
    cluster.start_all(range(SEEDS))
    acked: list[tuple[float, int]] = []  # (time, seq)
    stopped: list[int] = []
    began: list[float] = []
    try:
        cluster.wait_ready(range(SEEDS))
        leader = cluster.leader()
        followers = [i for i in range(SEEDS) if i != leader]
        seen = {i: Seen() for i in followers}
        cluster.start(NON_SEED)
        cluster.wait_ready([NON_SEED])

        async def subscriber(follower: int, stop: trio.Event) -> None:
            mine = seen[follower]
            servers = [f"{100 if i == follower else 1} {cluster.url(i)}" for i in range(SEEDS)]
            await subscribe_recording(
                servers, SUBJECT, stop,
                on_note=lambda note: mine.notes.append(note.status),
                on_message=lambda message: mine.received.append(
                    (trio.current_time(), len(mine.notes), message.type,
                     message.position.seq)))

        async def publisher(until: float) -> None:
            await publish_steadily(
                cluster.url(NON_SEED), SUBJECT, until, 150, mark=lambda: None,
                on_ack=lambda _, seq: acked.append((trio.current_time(), seq)))

        def look(follower: int) -> tuple[bool, str]:
            ready = cluster.ready(follower)
            try:
                status = cluster.status(follower)
            except OSError as error:
                return ready, f"/cluster: {error}"
            keys = ("raft_state", "raft_leader", "not_ready_reason", "applied_clsn")
            return ready, " ".join(f"{k}={status.get(k)}" for k in keys)

        async def watch_readiness(stop: trio.Event) -> None:
            while not stop.is_set():
                for follower in followers:
                    ready, text = await trio.to_thread.run_sync(look, follower)
                    seen[follower].readiness.append((trio.current_time(), ready, text))
                await trio.sleep(0.25)

        def stop_leader() -> None:
            process = cluster.processes[leader]
            assert process is not None
            if how == "sigterm":
                process.send_signal(signal.SIGTERM)
                assert process.wait(60) == 0
                cluster.start(leader)  # the pod recreated
                return
            process.send_signal(signal.SIGSTOP)
            stopped.append(leader)
            time.sleep(STOPPED_SECONDS)
            process.send_signal(signal.SIGCONT)
            stopped.remove(leader)

        def all_received() -> bool:
            return bool(acked) and all(
                len({s for _, _, k, s in mine.received if k is not MessageType.SNAPSHOT})
                >= len(acked) for mine in seen.values())

        async def main() -> None:
            stop = trio.Event()
            began.append(trio.current_time())
            async with trio.open_nursery() as nursery:
                for follower in followers:
                    nursery.start_soon(subscriber, follower, stop)
                nursery.start_soon(watch_readiness, stop)
                with trio.fail_after(20):
                    while any(NotificationStatus.SUBSCRIBE_ALLOW not in mine.notes
                              for mine in seen.values()):
                        await trio.sleep(0.05)
                async with trio.open_nursery() as load:
                    load.start_soon(publisher, trio.current_time() + 10)
                    await trio.sleep(2)
                    if how == "sigterm":
                        cluster.start_all(JOINING)  # scale-out
                    await trio.to_thread.run_sync(stop_leader)
                with trio.fail_after(30):
                    while not all_received():
                        await trio.sleep(0.1)
                stop.set()

        trio.run(main)
    finally:
        for index in stopped:
            process = cluster.processes[index]
            assert process is not None
            process.send_signal(signal.SIGCONT)
        cluster.stop()
    figures = f"{how}: leader {leader}; {len(acked)} acknowledged\n" + "\n".join(
        f"follower {i}: {report(mine, acked, began[0])}" for i, mine in seen.items())
    print(figures)
    for mine in seen.values():
        seqs = [s for _, _, kind, s in mine.received if kind is not MessageType.SNAPSHOT]
        assert seqs == list(range(1, len(seqs) + 1)), figures  # none lost, none twice
        assert {s for _, s in acked} <= set(seqs), figures
        assert NotificationStatus.DATA_RESYNC not in mine.notes, figures
        # never starved while the cluster acknowledged (the play: 1,372 in ~12 s)
        assert largest_silence(mine, acked)[1] < CACHED // 4, figures
