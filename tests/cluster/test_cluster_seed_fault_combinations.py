"""Combinations of seed faults no single-fault test names, with real member processes.

- **The leader SIGKILLed right after its log compaction, while a follower is down**
  (3 seeds: a window without a majority). The follower down since before the
  compaction comes back first: the one seed left holds a compacted log, so the
  returning follower can only catch up from its dump, then the old leader returns
  from its own dump. Nothing acknowledged is lost; a resume from a position from
  before the follower went down, on that follower, gets ``DATA_SYNC``.
- **Two seeds SIGKILLed and restarted one after the other** while a persistent MQTT
  session (clean session 0, QoS 1) and an SSE stream (``Last-Event-ID``) on them
  resume each time on the other seed: the second time on the seed restarted first.
"""

from __future__ import annotations

import contextlib
import json
import queue
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cluster_fixture import LocalCluster
from cluster_load import LoadPublisher, LoadSubscriber, delivery_problems
from test_cluster_fault_combinations import CACHE, answer_problems, merged_acks, order_inversions

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from httpclient import SseClient
from paho_client import PahoClient

from cluster.tooling import MQTT_OFFSET
from migratory.model.topic import subject_to_topic
from migratory.protocol import ops

SEEDS = [0, 1, 2]
NON_SEED = 3


def dump_time(cluster: LocalCluster, index: int) -> float:
    path = cluster.tmp_path / "data" / f"migratory-{index}" / "raft.dump"
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def wait_for_a_new_dump(cluster: LocalCluster, index: int, after: float, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while dump_time(cluster, index) <= after:
        if time.monotonic() > deadline:
            raise TimeoutError(f"member {index} wrote no dump")
        time.sleep(0.005)


@pytest.mark.slow
def test_the_leader_killed_after_its_compaction_while_a_follower_is_down(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(
        tmp_path, members=4, seeds=3, MaxCachedMessagesPerSubject=CACHE,
        ClusterLogCompactionEntries="100", ClusterLogCompactionTime="1",
    )
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=40)
        leader = cluster.leader()
        down, last = (i for i in SEEDS if i != leader)
        subscriber = LoadSubscriber([cluster.port(NON_SEED)], tag="live", duration=90)
        subscriber.start()
        subscriber.wait_subscribed(10)
        publishers = [LoadPublisher([cluster.port(NON_SEED)], rate=500, duration=60, tag="a")]
        publishers[0].start()
        publishers[0].wait_acked(1000, timeout=15)
        before_down = {s: m[-1][1] for s, m in publishers[0].acked_messages().items()}
        killed_at = time.time()
        cluster.kill(down)
        publishers[0].wait_acked(len(publishers[0].acked) + 1000, timeout=15)
        wait_for_a_new_dump(cluster, last, killed_at, timeout=15)
        compacted = dump_time(cluster, leader)
        wait_for_a_new_dump(cluster, leader, max(compacted, killed_at), timeout=15)
        cluster.kill(leader)  # right after its compaction: one seed of three left
        time.sleep(1.0)
        cluster.start(down)  # behind the compaction of the seed left: needs its dump
        cluster.wait_ready([down, last, NON_SEED], timeout=30)
        publishers[0].wait_acked(len(publishers[0].acked) + 500, timeout=15)
        cluster.start(leader)
        cluster.wait_ready(timeout=30)

        resumer = LoadSubscriber([cluster.port(down)], positions=before_down, tag="resumer",
                                 duration=60)
        resumer.start()
        resumer.wait_statuses(4, ops.Status.DATA_SYNC, ops.Status.DATA_RESYNC, timeout=15)
        publishers[0].wait_acked(len(publishers[0].acked) + 500, timeout=15)
        publishers[0].stop()
        acked = merged_acks(publishers)
        contents = {c for messages in acked.values() for c, _ in messages}
        subscriber.wait_for(contents, 30)
        resumer.wait_for(
            {c for s, m in acked.items() for c, p in m if p > before_down[s]}, 30
        )
        for sub in (subscriber, resumer):
            sub.stop()
        assert delivery_problems(subscriber.messages(), acked) == []
        assert delivery_problems(resumer.messages(), acked, after=before_down) == []
        assert resumer.statuses(ops.Status.DATA_RESYNC) == []
        assert subscriber.statuses(ops.Status.DATA_RESYNC) == []
        assert answer_problems(publishers, [subscriber, resumer]) == []
        assert order_inversions(publishers[0]) == []
        assert cluster.exited() == {}
        for i in range(4):
            assert "Traceback" not in cluster.log(i), cluster.log(i)[-3000:]
        cluster.wait_same_applied(range(4))
        print(f"leader {leader}, down {down}; {publishers[0].summary()}; "
              f"dump loads on {down}: {cluster.log(down).count('Raft dump')}")
    finally:
        cluster.stop()


SUBJECT = "/load/s0"


def ready(cluster: LocalCluster, index: int) -> bool:
    try:
        with urllib.request.urlopen(f"{cluster.http(index)}/readyz", timeout=1):
            return True
    except (OSError, urllib.error.URLError):
        return False


class MqttDevice(threading.Thread):
    """A persistent session (clean session 0, QoS 1) on the members at ``ports`` in
    turn: when its member goes away it connects to the next one that is ready."""

    def __init__(self, cluster: LocalCluster, members: list[int], duration: float) -> None:
        super().__init__(daemon=True, name="mqtt-device")
        self.cluster, self.members, self.duration = cluster, members, duration
        self.payloads: list[bytes] = []
        self.sessions: list[tuple[int, bool]] = []
        """(member, session present) of each connection."""
        self.errors: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + self.duration
        turn = 0
        while not self.done.is_set() and time.monotonic() < deadline:
            member = self.members[turn % len(self.members)]
            turn += 1
            if not ready(self.cluster, member):
                time.sleep(0.1)
                continue
            try:
                device = PahoClient(self.cluster.port(member) + MQTT_OFFSET, "device",
                                    clean_session=False, timeout=5)
            except (OSError, queue.Empty) as exc:
                self.errors.append(f"{member}: {exc!r}")
                continue
            if device.return_code:
                self.errors.append(f"{member}: CONNACK {device.return_code}")
                device.drop()
                continue
            self.sessions.append((member, device.session_present))
            if not device.session_present:
                assert device.subscribe(subject_to_topic(SUBJECT), 1) == [1]
            while not (self.done.is_set() or device.disconnected.is_set()):
                with contextlib.suppress(queue.Empty):
                    self.payloads.append(device.messages.get(timeout=0.1).payload)
            while not device.messages.empty():
                self.payloads.append(device.messages.get().payload)
            device.drop()


class SseFollower(threading.Thread):
    """An SSE stream of :data:`SUBJECT` that resumes with ``Last-Event-ID`` on the next
    member when its member goes away (or answers 503)."""

    def __init__(self, cluster: LocalCluster, members: list[int], duration: float) -> None:
        super().__init__(daemon=True, name="sse")
        self.cluster, self.members, self.duration = cluster, members, duration
        self.events: list[dict[str, Any]] = []
        self.last_id: str | None = None
        self.streams: list[int] = []
        self.done = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + self.duration
        turn = 0
        while not self.done.is_set() and time.monotonic() < deadline:
            member = self.members[turn % len(self.members)]
            turn += 1
            try:
                stream = SseClient(self.cluster.port(member), [SUBJECT],
                                   last_event_id=self.last_id)
                if stream.wait_head() != 200:
                    stream.close()
                    time.sleep(0.2)
                    continue
                self.streams.append(member)
                while not self.done.is_set() and not stream.closed:
                    event = stream.next_event(timeout=0.2)
                    if event is not None:
                        self.events.append(event)
                        self.last_id = stream.last_id
                stream.close()
            except (OSError, ValueError, json.JSONDecodeError):
                time.sleep(0.2)


@pytest.mark.slow
def test_two_seeds_restarted_in_turn_under_a_persistent_mqtt_session_and_sse(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path, members=4, seeds=3, MaxCachedMessagesPerSubject=CACHE)
    for i, settings in enumerate(cluster.settings):
        settings["ListenMqtt"] = f"127.0.0.1:{cluster.port(i) + MQTT_OFFSET}"
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=40)
        first, second = 1, 2
        device = MqttDevice(cluster, [first, second], duration=60)
        sse = SseFollower(cluster, [first, second], duration=60)
        device.start()
        sse.start()
        deadline = time.monotonic() + 15
        while not (device.sessions and any(e["event"] == "subscribe" for e in sse.events)):
            assert time.monotonic() < deadline, (device.errors, sse.events[:3])
            time.sleep(0.05)
        publisher = LoadPublisher([cluster.port(NON_SEED)], rate=200, duration=60,
                                  subjects=(SUBJECT,))
        publisher.start()
        publisher.wait_acked(300, timeout=15)
        for seed in (first, second):
            cluster.kill(seed)
            time.sleep(0.5)
            cluster.start(seed)
            cluster.wait_ready(timeout=30)
            publisher.wait_acked(len(publisher.acked) + 300, timeout=20)
        publisher.stop()
        acked = merged_acks([publisher])[SUBJECT]
        position_of = {content: position for content, position in acked}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            set(position_of) <= set(device.payloads)
            and set(position_of) <= {e["data"]["content"].encode() for e in sse.events
                                     if e["event"] == "message"}
        ):
            time.sleep(0.2)
        device.done.set()
        sse.done.set()
        device.join(10)
        sse.join(10)

        # MQTT QoS 1: every acknowledged message, in order; repeats allowed
        missing = [c for c in position_of if c not in set(device.payloads)]
        assert not missing, f"MQTT lost {len(missing)}: {missing[:5]}"
        firsts = [position_of[c] for c in dict.fromkeys(device.payloads) if c in position_of]
        assert firsts == sorted(firsts), "MQTT out of order"
        assert [present for _, present in device.sessions[1:]] == [True] * (
            len(device.sessions) - 1), device.sessions
        assert len(device.sessions) >= 3, device.sessions

        # SSE: exactly once, in order, no resync
        assert not [e for e in sse.events if e["event"] == "resync"], sse.events[-5:]
        messages = [e["data"] for e in sse.events if e["event"] == "message"]
        delivered = [m["content"].encode() for m in messages]
        assert len(delivered) == len(set(delivered)), "SSE delivered a message twice"
        assert [position_of[c] for c in delivered if c in position_of] == sorted(
            position_of[c] for c in delivered if c in position_of), "SSE out of order"
        assert set(position_of) <= set(delivered)
        assert len(sse.streams) >= 3, sse.streams
        failed = {publisher.sent[c][1] for c, why in publisher.failed.items()
                  if "outcome unknown" not in why}
        assert not failed & (set(delivered) | set(device.payloads)), "failed, delivered"
        assert order_inversions(publisher) == []
        assert cluster.exited() == {}
        print(f"MQTT sessions {device.sessions}, {len(device.payloads)} received "
              f"({len(device.payloads) - len(set(device.payloads))} again); SSE streams "
              f"{sse.streams}, {len(messages)} events; "
              f"{publisher.summary()}")
    finally:
        cluster.stop()


@pytest.mark.slow
def test_the_leader_stopped_by_its_full_disk_at_a_dump_comes_back_behind_a_compaction(
    tmp_path: Path,
) -> None:
    """The leader cannot write its compaction's dump (a directory where ``raft.dump.tmp``
    goes: the stop a full disk makes, cluster/raft_dump_files.py): it exits with
    publishers and subscribers on it and the non-seed following it, the others elect and
    compact past it while it is away; its directory mended, it comes back from its own
    log and must catch up from the new leader's dump."""
    cluster = LocalCluster(
        tmp_path, members=4, seeds=3, MaxCachedMessagesPerSubject=CACHE,
        ClusterLogCompactionEntries="100", ClusterLogCompactionTime="1",
    )
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=40)
        leader = cluster.leader()
        others = [i for i in SEEDS if i != leader]
        everywhere = [leader, NON_SEED, *others]
        subscribers = [
            LoadSubscriber([cluster.port(i) for i in everywhere], tag="on-leader", duration=90),
            LoadSubscriber([cluster.port(i) for i in [NON_SEED, *others]], tag="non-seed",
                           duration=90),
        ]
        for subscriber in subscribers:
            subscriber.start()
            subscriber.wait_subscribed(10)
        publishers = [
            LoadPublisher([cluster.port(i) for i in everywhere], rate=400, duration=60,
                          tag="a"),
            LoadPublisher([cluster.port(NON_SEED)], rate=400, duration=60, tag="b"),
        ]
        for publisher in publishers:
            publisher.start()
            publisher.wait_acked(600, timeout=15)
        full = tmp_path / "data" / f"migratory-{leader}" / "raft.dump.tmp"
        deadline = time.monotonic() + 10
        while True:  # its next dump cannot be written (once the one being written is)
            try:
                full.mkdir()
                break
            except FileExistsError:
                assert time.monotonic() < deadline, "the leader's dump stays half-written"
                time.sleep(0.01)
        process = cluster.processes[leader]
        assert process is not None
        process.wait(20)
        assert process.returncode == 1, process.returncode
        stopped_at = time.time()
        cluster.wait_ready([NON_SEED, *others], timeout=30)
        for i in others:
            wait_for_a_new_dump(cluster, i, stopped_at, timeout=15)
        for publisher in publishers:
            publisher.wait_acked(len(publisher.acked) + 400, timeout=15)
        full.rmdir()
        cluster.start(leader)
        cluster.wait_ready(timeout=30)
        for publisher in publishers:
            publisher.wait_acked(len(publisher.acked) + 400, timeout=15)
            publisher.stop()
        acked = merged_acks(publishers)
        contents = {c for messages in acked.values() for c, _ in messages}
        for subscriber in subscribers:
            subscriber.wait_for(contents, 30)
            subscriber.stop()
            assert delivery_problems(subscriber.messages(), acked) == [], subscriber.tag
            assert subscriber.statuses(ops.Status.DATA_RESYNC) == [], subscriber.tag
        assert answer_problems(publishers, subscribers) == []
        assert [order_inversions(p) for p in publishers] == [[], []]
        assert cluster.exited() == {}
        assert "cannot write" in cluster.log(leader)
        for i in range(4):
            assert "Traceback" not in cluster.log(i), cluster.log(i)[-3000:]
        cluster.wait_same_applied(range(4))
        print(f"leader {leader} stopped at its dump; " + "; ".join(
            p.summary() for p in publishers))
    finally:
        cluster.stop()
