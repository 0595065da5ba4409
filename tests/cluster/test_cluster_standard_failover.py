"""Standard mode with real member processes, a member SIGKILLed while another's
publisher goes on: an SSE stream resumed with its Last-Event-ID on another member, and an
MQTT persistent session resumed there, get that member's snapshot (a counted resync), then
every later message, in order, none twice (Standard: failover gives the snapshot only)."""

from __future__ import annotations

import json
import queue
import random
import sys
import urllib.request
from pathlib import Path
from typing import Any

import trio
from cluster_fixture import LocalCluster
from test_cluster_mqtt_resume import mqtt_port, with_mqtt
from test_cluster_processes import Background, Publisher
from test_cluster_sse_failover import resume
from test_cluster_standard import _forwarding

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from httpclient import SseClient
from paho_client import PahoClient

from migratory.model.message import MessageType
from migratory_client import NotificationStatus, ReconnectPolicy, connect

FAST = ReconnectPolicy(initial_delay=0.05, max_delay=0.2, connect_timeout=3.0)


def standard_cluster(tmp_path: Path, *, mqtt: bool = False) -> LocalCluster:
    cluster = LocalCluster(tmp_path, members=3, mode="Standard")
    if mqtt:
        with_mqtt(cluster)
    cluster.start_all()
    cluster.wait_ready()
    _forwarding(cluster, [0, 1, 2])
    return cluster


def not_a_suffix(received: list[bytes], acked: list[bytes]) -> list[bytes]:
    """``received`` (repeats dropped) must be ``acked`` from some message on: the
    snapshot's, then every later one in order. What breaks that (empty when nothing)."""
    firsts = list(dict.fromkeys(received))
    if not firsts or firsts[0] not in acked:
        return firsts
    expected = acked[acked.index(firsts[0]):]
    return [a for a, b in zip(firsts, expected, strict=False) if a != b] or (
        expected[len(firsts):] if len(firsts) < len(expected) else firsts[len(expected):])


def test_sse_stream_resumed_on_another_standard_member_gets_its_snapshot_then_all(
    tmp_path: Path,
) -> None:
    cluster = standard_cluster(tmp_path)
    try:
        stream = SseClient(cluster.port(1), ["/Scores/NBA/LAL"])
        assert stream.events_until("subscribe")
        publisher = Publisher(cluster, 2, count=120, pause=0.01)
        publisher.start()
        before = 0
        while before < 25:
            event = stream.next_event(timeout=10)
            assert event is not None
            before += event["event"] == "message"
        last_id = stream.last_id
        cluster.kill(1)
        stream.close()
        resumed = resume(cluster.port(0), last_id)
        after = resumed.events_until("resync", timeout=15)
        assert after[-2]["event"] == "message" and after[-2]["data"]["type"] == "snapshot"
        publisher.finish(60)
        acked = [content for content, _ in publisher.acked]
        events: list[dict[str, Any]] = [after[-2]]
        for _ in range(len(acked)):
            if events[-1]["data"]["content"].encode() == acked[-1]:
                break
            event = resumed.next_event(timeout=10)
            assert event is not None, events[-3:]
            if event["event"] == "message":
                events.append(event)
        contents = [e["data"]["content"].encode() for e in events]
        assert not_a_suffix(contents, acked) == [] and len(contents) == len(set(contents))
        seqs = [e["data"]["seq"] for e in events]
        assert seqs == sorted(set(seqs)), "duplicate or reordered event"
    finally:
        cluster.stop()


def stats(cluster: LocalCluster, index: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"{cluster.http(index)}/stats", timeout=2) as reply:
        result: dict[str, Any] = json.loads(reply.read())
        return result


def test_mqtt_session_resumed_on_another_standard_member_gets_its_snapshot_then_all(
    tmp_path: Path,
) -> None:
    cluster = standard_cluster(tmp_path, mqtt=True)
    try:
        device = PahoClient(mqtt_port(cluster, 1), "scoreboard", clean_session=False)
        assert device.subscribe("Scores/NBA/+", 1) == [1]
        publisher = Publisher(cluster, 2, count=120, pause=0.01)
        publisher.start()
        seen = [m.payload for m in device.receive(25, timeout=30)]
        killer = Background(cluster.kill, 1)
        killer.start()
        killer.finish(15)
        device.client.loop_stop()
        resumed = PahoClient(mqtt_port(cluster, 0), "scoreboard", clean_session=False)
        assert resumed.session_present, "the session record was not forwarded"
        publisher.finish(60)
        acked = [content for content, _ in publisher.acked]
        payloads: list[bytes] = []
        for _ in range(len(acked) + 10):
            if payloads and payloads[-1] == acked[-1]:
                break
            try:
                payloads += [m.payload for m in resumed.receive(1, timeout=10)]
            except queue.Empty:
                break
        assert not_a_suffix(payloads, acked) == [], payloads
        # from before what the device missed (repeats: QoS 1 is at least once), or a gap
        # counted (MQTT cannot tell the client: the snapshot, then what follows it)
        resynced = stats(cluster, 0)["mqtt_resyncs"]
        start = acked.index(payloads[0])
        print(f"resumed from message {start} (had {acked.index(seen[-1]) + 1}), "
              f"mqtt_resyncs {resynced}")
        assert start <= acked.index(seen[-1]) + 1 or resynced >= 1
        resumed.stop()
    finally:
        cluster.stop()


def test_sdk_subscriber_failing_over_between_standard_members_is_told_resync(
    tmp_path: Path,
) -> None:
    """The SDK's member killed: it resumes on another one from a position that member
    never gave, gets its snapshot and DATA_RESYNC, then every later message in order."""
    cluster = standard_cluster(tmp_path)
    try:
        publisher: list[Publisher] = []
        killers: list[Background] = []
        received: list[tuple[bytes, MessageType, int, int]] = []
        statuses: list[tuple[NotificationStatus, int]] = []

        async def main() -> None:
            servers = [f"100 {cluster.url(1)}", f"1 {cluster.url(0)}"]
            async with (
                connect(servers, reconnect=FAST, rng=random.Random(7)) as client,
                client.subscribe("/Scores/NBA/LAL") as subscription,
            ):

                async def notes() -> None:
                    async for note in client.notifications():
                        statuses.append((note.status, len(received)))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(notes)
                    await client.wait_connected()
                    await trio.sleep(0.3)
                    pub = Publisher(cluster, 2, count=120, pause=0.01)
                    publisher.append(pub)
                    pub.start()
                    with trio.fail_after(60):
                        while pub.is_alive() or not pub.acked or (
                                not received or received[-1][0] != pub.acked[-1][0]):
                            with trio.move_on_after(0.2):
                                message = await subscription.__anext__()
                                received.append((message.content, message.type,
                                                 message.epoch, message.seq))
                                if len(received) == 30:
                                    killers.append(Background(cluster.kill, 1))
                                    killers[-1].start()
                    nursery.cancel_scope.cancel()

        trio.run(main)
        publisher[0].finish(30)
        for killer in killers:
            killer.finish(15)
        acked = [content for content, _ in publisher[0].acked]
        resyncs = [at for status, at in statuses if status is NotificationStatus.DATA_RESYNC]
        assert resyncs, statuses
        lineages: dict[int, list[int]] = {}
        for _, kind, epoch, seq in received:
            if kind is not MessageType.SNAPSHOT:
                lineages.setdefault(epoch, []).append(seq)
        assert all(seqs == sorted(set(seqs)) for seqs in lineages.values()), "repeat or reorder"
        snapshot = max(i for i, r in enumerate(received) if r[1] is MessageType.SNAPSHOT)
        after = [content for content, _, _, _ in received[snapshot:]]
        assert not_a_suffix(after, acked) == [] and len(after) == len(set(after)), after
        before = [content for content, _, _, _ in received[:snapshot]]
        assert before == acked[: len(before)]
        print(f"before the kill {len(before)}, after the snapshot {len(after)}; again "
              f"{len(set(before) & set(after[1:]))}, skipped "
              f"{acked.index(after[0]) - acked.index(before[-1]) - 1}")
    finally:
        cluster.stop()
