"""A Guaranteed cluster held at its limits while the Raft leader is SIGKILLed.

``pending``: ClusterMaxPendingPublishes 50 on every member, saturated by publishers on a
follower seed (bursts far above what 50 pending allow); ``size``: publishes of exactly
MaxMessageSize (content + subject) at ~20 MB/s. The leader is killed meanwhile: each publish
gets an answer -- PUBLISH_OK, PUBLISH_FAILED "overloaded" (refused), or another
PUBLISH_FAILED (a definite failure or an unknown outcome at the leader's change) -- and a
subscriber on the other follower gets every acknowledged one, in order, none twice (or
says DATA_RESYNC). No member logs a Traceback; only the killed one has exited."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio
from cluster_fixture import LocalCluster
from steady_load import FAST, subscribe_recording

from migratory.model.message import MessageType
from migratory_client import NotificationStatus, connect

SUBJECT = "/Limits/Failover/A"
PENDING = 50
MAX_MESSAGE = 131072  # MaxMessageSize's default
PERIOD = 0.05
LOAD_SECONDS = 3.0
KILL_AT = 1.0


@pytest.mark.slow
@pytest.mark.parametrize(("limit", "clients", "burst"), [
    ("pending", 4, 40),  # ~3,200 publishes/s against 50 pending
    ("size", 2, 4),  # ~160 publishes/s of MaxMessageSize each (~20 MB/s)
])
def test_a_cluster_at_its_limits_through_a_leader_kill_loses_no_acknowledged_publish(
    tmp_path: Path, limit: str, clients: int, burst: int,
) -> None:
    settings = {"ClusterMaxPendingPublishes": str(PENDING)} if limit == "pending" else {}
    cluster = LocalCluster(tmp_path, members=3, **settings)
    big = limit == "size"
    cluster.start_all()
    acked: list[int] = []
    reasons: dict[str, int] = {}
    errors: list[str] = []
    received: list[tuple[int, MessageType, int]] = []  # (notes before, type, seq)
    notes: list[NotificationStatus] = []
    try:
        cluster.wait_ready()
        leader = cluster.leader()
        publishing, watching = [i for i in range(3) if i != leader]

        async def publisher(until: float) -> None:
            async with connect([cluster.url(publishing)], reconnect=FAST,
                               rng=random.Random(2)) as client:
                async def one(n: int) -> None:
                    try:
                        content = f"m{n}".encode()
                        if big:  # content + subject: exactly MaxMessageSize
                            content = content.ljust(MAX_MESSAGE - len(SUBJECT), b".")
                        result = await client.publish(SUBJECT, content, timeout=20)
                    except Exception as error:  # recorded, asserted below
                        errors.append(repr(error))
                        return
                    if result.ok:
                        assert result.position is not None
                        acked.append(result.position.seq)
                    else:
                        key = (result.reason or "").split(":")[0]
                        reasons[key] = reasons.get(key, 0) + 1

                async with trio.open_nursery() as nursery:
                    n = 0
                    while trio.current_time() < until:
                        for _ in range(burst):
                            nursery.start_soon(one, n)
                            n += 1
                        await trio.sleep(PERIOD)

        async def main() -> None:
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: subscribe_recording(
                    [f"100 {cluster.url(watching)}", f"1 {cluster.url(publishing)}"],
                    SUBJECT, stop, on_note=lambda note: notes.append(note.status),
                    on_message=lambda m: received.append(
                        (len(notes), m.type, m.position.seq))))
                with trio.fail_after(20):
                    while NotificationStatus.SUBSCRIBE_ALLOW not in notes:
                        await trio.sleep(0.05)
                async with trio.open_nursery() as load:
                    until = trio.current_time() + LOAD_SECONDS
                    for _ in range(clients):
                        load.start_soon(publisher, until)
                    await trio.sleep(KILL_AT)
                    await trio.to_thread.run_sync(cluster.kill, leader)
                with trio.fail_after(30):
                    while not set(acked) <= {s for _, _, s in received}:
                        await trio.sleep(0.1)
                stop.set()

        trio.run(main)
        exited = cluster.exited()
        logs = {i: cluster.log(i) for i in range(3)}
    finally:
        cluster.stop()
    seqs = [s for _, kind, s in received if kind is not MessageType.SNAPSHOT]
    figures = (f"{limit}: leader {leader} killed; {len(acked)} acknowledged, "
               f"refused/failed {reasons}, errors {len(errors)} {errors[:3]}; "
               f"subscriber {len(seqs)} received, notes {[n.value for n in notes]}")
    print(figures)
    assert exited == {leader: -9}, figures
    assert not errors, figures  # every publish answered
    if limit == "pending":
        assert reasons.get("overloaded", 0) > 0, figures  # the limit was reached
    assert len(set(acked)) == len(acked), figures
    assert set(acked) <= set(seqs), figures
    if NotificationStatus.DATA_RESYNC not in notes:
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), figures
    assert len(set(seqs)) == len(seqs), figures
    for i, text in logs.items():
        assert "Traceback" not in text, f"member {i}:\n{text[-3000:]}"
