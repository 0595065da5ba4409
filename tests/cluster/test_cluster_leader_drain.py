"""The Raft leader stopped as Kubernetes stops a pod (SIGTERM), with a subscriber on it,
under steady publish load (~150 acknowledged publishes/s on another member) and
non-seeds joining meanwhile, as the play ``scale-out-in-leader-restart`` does
(tests/deploy/scaling_faults.py, which once failed with a subscriber on the leader's pod
that got nothing for ~12 s and resumed 1,372 messages back: DATA_RESYNC).

A subscriber connected to a draining member keeps receiving every committed message until
its member closes it, and the close comes as soon as its publishes are settled: every
publish acknowledged before the SIGTERM reached it live, on the leader, before its
SERVER_DOWN, and it resumes elsewhere with DATA_SYNC from a position far inside the cache
(MaxCachedMessagesPerSubject: 1000), no message lost, none twice."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
from cluster_fixture import LocalCluster
from steady_load import publish_steadily, subscribe_recording

from migratory.model.message import MessageType
from migratory_client import NotificationStatus

SUBJECT = "/Elastic/LeaderDrain/A"
SEEDS, NON_SEEDS = 3, 2
CACHED = 1000  # MaxCachedMessagesPerSubject's default


@dataclass
class Seen:
    received: list[tuple[int, MessageType, int]] = field(default_factory=list)
    """(index of the notification before it, type, seq)"""
    notes: list[NotificationStatus] = field(default_factory=list)
    acked: list[tuple[bool, int]] = field(default_factory=list)
    """(acknowledged before the SIGTERM was sent, seq)"""
    sigterm_sent: bool = False


@pytest.mark.slow
def test_subscriber_on_the_raft_leader_gets_every_message_until_its_drain_closes_it(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path, members=SEEDS + NON_SEEDS, seeds=SEEDS)
    cluster.start_all(range(SEEDS))
    seen = Seen()
    try:
        cluster.wait_ready(range(SEEDS))
        leader = cluster.leader()
        other = (leader + 1) % SEEDS

        # on the leader (a reconnect avoids the member that failed: then another seed)
        servers = [f"{100 if i == leader else 1} {cluster.url(i)}" for i in range(SEEDS)]

        async def subscriber(stop: trio.Event) -> None:
            await subscribe_recording(
                servers, SUBJECT, stop,
                on_note=lambda note: seen.notes.append(note.status),
                on_message=lambda message: seen.received.append(
                    (len(seen.notes), message.type, message.position.seq)))

        async def publisher(until: float) -> None:
            await publish_steadily(
                cluster.url(other), SUBJECT, until, 150,
                mark=lambda: not seen.sigterm_sent,
                on_ack=lambda before, seq: seen.acked.append(
                    (before and not seen.sigterm_sent, seq)))

        def stop_leader() -> int:
            process = cluster.processes[leader]
            assert process is not None
            seen.sigterm_sent = True
            process.send_signal(signal.SIGTERM)
            return process.wait(60)

        async def main() -> None:
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(subscriber, stop)
                with trio.fail_after(20):
                    while NotificationStatus.SUBSCRIBE_ALLOW not in seen.notes:
                        await trio.sleep(0.05)
                async with trio.open_nursery() as load:
                    load.start_soon(publisher, trio.current_time() + 8)
                    await trio.sleep(2)
                    cluster.start_all(range(SEEDS, SEEDS + NON_SEEDS))  # scale-out
                    await trio.sleep(0.3)
                    assert await trio.to_thread.run_sync(stop_leader) == 0
                with trio.fail_after(30):
                    while len({s for _, k, s in seen.received if k is not MessageType.SNAPSHOT}
                              ) < len(seen.acked) or not seen.acked:
                        await trio.sleep(0.1)
                stop.set()

        trio.run(main)
    finally:
        cluster.stop()
    drains = [line for line in cluster.log(leader).splitlines() if "drained in" in line]
    down = seen.notes.index(NotificationStatus.SERVER_DOWN)
    live = [s for before, kind, s in seen.received
            if before <= down and kind is MessageType.UPDATE]
    recovered = [s for _, kind, s in seen.received if kind is MessageType.RECOVERED]
    seqs = [s for _, kind, s in seen.received if kind is not MessageType.SNAPSHOT]
    acked_before = max(s for before, s in seen.acked if before)
    figures = (f"leader {leader}: {seen.notes}; live up to {live[-1] if live else None}, "
               f"acknowledged before the SIGTERM up to {acked_before}, then "
               f"{len(recovered)} recovered; {drains}")
    print(figures)
    assert seqs == list(range(1, len(seqs) + 1)), figures  # none lost, none twice
    assert {s for _, s in seen.acked} <= set(seqs), figures
    assert NotificationStatus.DATA_RESYNC not in seen.notes, figures
    assert NotificationStatus.DATA_SYNC in seen.notes[down:], figures
    # the leader delivered every publish acknowledged before its SIGTERM, live
    assert live and live[-1] >= acked_before, figures
    # and closed its subscriber promptly: the resume is far inside the cache
    assert len(recovered) < CACHED // 4, figures

