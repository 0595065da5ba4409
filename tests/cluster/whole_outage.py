"""Whole-cluster outages for real-process tests: every member SIGKILLed at once (a power
cut as the processes see it), started again in a given order, and the checks that hold
every acknowledged publish to its position across it.

A subscriber only sees what comes after its position, so a message it got and the
cluster later replaced at that position (a rollback) would pass its own check:
:func:`rollbacks` reads every subject again from seq 1 at the end (the cache reaches
back that far) and compares what each subscriber got with what the cluster holds now.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path

import trio
from cluster_fixture import LocalCluster
from cluster_load import SUBJECTS, LoadPublisher, LoadSubscriber, delivery_problems
from test_cluster_fault_combinations import BAD_LOG_LINES, answer_problems, merged_acks
from test_cluster_seed_fault_combinations import MqttDevice, SseFollower

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory_client import NotificationStatus, ReconnectPolicy, connect

CACHE = "20000"
"""MaxCachedMessagesPerSubject: the final read reaches back to seq 1."""
HANG_GUARD = 60.0  # s: only against a hang, never the claim
FAST = ReconnectPolicy(initial_delay=0.05, max_delay=0.3, connect_timeout=3.0)


def power_cut(cluster: LocalCluster, members: Iterable[int] | None = None) -> None:
    """SIGKILL every member (or ``members``) before waiting for any: none outlives another
    by more than the signals' loop."""
    chosen = list(range(cluster.members) if members is None else members)
    for i in chosen:
        process = cluster.processes[i]
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
    for i in chosen:
        process = cluster.processes[i]
        if process is not None:
            process.wait(10)


def start_in_order(cluster: LocalCluster, order: Sequence[int], gap: float) -> None:
    """Start ``order``, the next ``gap`` seconds after the one before."""
    for n, i in enumerate(order):
        if n:
            time.sleep(gap)
        cluster.start(i)


def raft_state(cluster: LocalCluster, i: int) -> dict[str, object] | None:
    try:
        return cluster.status(i)
    except OSError:
        return None


def publish_until(publisher: LoadPublisher, more: int) -> None:
    """Until ``more`` further publishes are acknowledged (a count, not a time)."""
    publisher.wait_acked(len(publisher.acked) + more, HANG_GUARD)


def data_dir(cluster: LocalCluster, i: int) -> Path:
    return cluster.tmp_path / "data" / f"migratory-{i}"


class SdkFollower(threading.Thread):
    """The native SDK (its own reconnect and resume) subscribed to :data:`SUBJECTS` on
    every member, recording (subject, epoch, seq, content, type) and its notifications."""

    def __init__(self, cluster: LocalCluster, members: Sequence[int]) -> None:
        super().__init__(daemon=True, name="sdk")
        self.servers = [f"100 {cluster.url(i)}" for i in members]
        self.received: list[tuple[str, int, int, bytes, MessageType]] = []
        self.notes: list[NotificationStatus] = []
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported by the test
            self.error = exc

    async def _main(self) -> None:
        async with (
            connect(self.servers, reconnect=FAST, rng=random.Random(3)) as client,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(self._notes, client)
            for subject in SUBJECTS:
                nursery.start_soon(self._follow, client, subject)
            with trio.move_on_after(HANG_GUARD * 2):
                while not self.done.is_set():
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()

    async def _notes(self, client: object) -> None:
        async for note in client.notifications():  # type: ignore[attr-defined]
            self.notes.append(note.status)

    async def _follow(self, client: object, subject: str) -> None:
        async with client.subscribe(subject) as subscription:  # type: ignore[attr-defined]
            async for m in subscription:
                self.received.append((m.subject, m.epoch, m.seq, m.content, m.type))

    def problems(self, acked: dict[str, list[tuple[bytes, Position]]]) -> list[str]:
        return sdk_problems(list(self.received), list(self.notes), acked)


def sdk_problems(
    received: list[tuple[str, int, int, bytes, MessageType]],
    notes: list[NotificationStatus],
    acked: dict[str, list[tuple[bytes, Position]]],
) -> list[str]:
    """Every acknowledged message once, in order, at its position (from the first the
    SDK got of its subject on); no resync."""
    out = []
    for subject in acked:
        got = [(Position(e, s), c) for sub, e, s, c, t in received
               if sub == subject and t is not MessageType.SNAPSHOT]
        positions = [p for p, _ in got]
        if positions != sorted(set(positions)):
            out.append(f"sdk {subject}: twice or out of order")
        held = dict(got)
        first = positions[0] if positions else None
        for content, position in acked[subject]:
            if first is not None and position < first:
                continue  # before it subscribed
            if held.get(position) != content:
                out.append(f"sdk {subject} {position}: acknowledged {content!r}, "
                           f"got {held.get(position)!r}")
    if NotificationStatus.DATA_RESYNC in notes:
        out.append("sdk: DATA_RESYNC")
    return out[:10]


def rollbacks(
    cluster: LocalCluster,
    member: int,
    acked: dict[str, list[tuple[bytes, Position]]],
    received: dict[str, dict[Position, bytes]],
) -> list[str]:
    """Read every subject from seq 1 on ``member`` (one subject a subscribe: the answer
    of all at once may be refused as too large) and compare: every acknowledged message
    at its position, every position a subscriber got holding what it got."""
    epochs = {s: messages[0][1].epoch for s, messages in acked.items() if messages}
    history: list[Message] = []
    for subject, epoch in epochs.items():
        reader = LoadSubscriber([cluster.port(member)], tag=f"reader {subject}",
                                duration=HANG_GUARD, subjects=(subject,),
                                positions={subject: Position(epoch, 0)})
        reader.start()
        try:
            reader.wait_for({c for c, _ in acked[subject]}, 30)
        finally:
            reader.stop()
        history += [m for m in reader.messages() if m.type is not MessageType.SNAPSHOT]
    held = {(m.subject, m.position): m.content for m in history}
    return (delivery_problems(history, acked) + replaced(held, received, epochs)
            + snapshot_problems(cluster, history))


def snapshot_problems(cluster: LocalCluster, history: list[Message]) -> list[str]:
    """Each member up serves as a subject's snapshot (HTTP) its last retained message,
    at its position."""
    last: dict[str, Message] = {}
    for m in history:
        if m.retained:
            last[m.subject] = m
    out = [] if last or not history else ["no retained message in the history"]
    for i in range(cluster.members):
        if i in cluster.exited():
            continue
        for subject, message in last.items():
            url = f"{cluster.http(i)}/snapshot?subject={subject}&format=json"
            with urllib.request.urlopen(url, timeout=5) as reply:
                got = json.loads(reply.read())
            if (got["content"].encode(), got["epoch"], got["seq"]) != (
                message.content, message.position.epoch, message.position.seq
            ):
                out.append(f"member {i} {subject}: snapshot {got}, last retained {message}")
    return out


def replaced(
    held: dict[tuple[str, Position], bytes],
    received: dict[str, dict[Position, bytes]],
    epochs: dict[str, int],
) -> list[str]:
    """Each position a subscriber got (in the subject's epoch) that the cluster now
    ``held`` with another content, or not at all."""
    out = []
    for subject, got in received.items():
        for position, content in got.items():
            now = held.get((subject, position))
            if position.epoch == epochs.get(subject) and now != content:
                out.append(f"{subject} {position}: delivered {content!r}, now {now!r}")
    return out


def received_by(subscribers: Iterable[LoadSubscriber]) -> dict[str, dict[Position, bytes]]:
    out: dict[str, dict[Position, bytes]] = {}
    for subscriber in subscribers:
        for m in subscriber.messages():
            if m.type is not MessageType.SNAPSHOT:
                out.setdefault(m.subject, {})[m.position] = m.content
    return out


def check_outage(
    cluster: LocalCluster,
    publishers: list[LoadPublisher],
    subscribers: list[LoadSubscriber],
    *,
    down: set[int] = frozenset(),  # type: ignore[assignment]
    sdk: SdkFollower | None = None,
) -> dict[str, list[tuple[bytes, Position]]]:
    """Every acknowledged publish delivered to every subscriber once, in order, at its
    position, without DATA_RESYNC; nothing a subscriber got replaced since; failures
    truthful; no member up exited or logged a bad line. ``down``: members left down."""
    acked = merged_acks(publishers)
    contents = {c for messages in acked.values() for c, _ in messages}
    for subscriber in subscribers:
        subscriber.wait_for(contents, 30)
    for subscriber in subscribers:
        subscriber.stop()
        problems = delivery_problems(subscriber.messages(), acked)
        assert problems == [], (subscriber.tag, problems[:10])
        assert subscriber.statuses(ops.Status.DATA_RESYNC) == [], subscriber.tag
    if sdk is not None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sdk.problems(acked):
            time.sleep(0.2)
        sdk.done.set()
        sdk.join(10)
        assert sdk.error is None, repr(sdk.error)
        assert sdk.problems(acked) == []
    assert answer_problems(publishers, subscribers) == []
    up = next(i for i in range(cluster.members) if i not in down)
    assert rollbacks(cluster, up, acked, received_by(subscribers)) == []
    assert set(cluster.exited()) == set(down), cluster.exited()
    for i in range(cluster.members):
        text = cluster.log(i)
        assert not [bad for bad in BAD_LOG_LINES if bad in text], f"member {i}:\n{text[-3000:]}"
    return acked


def device_problems(
    mqtt: MqttDevice, sse: SseFollower, acked: list[tuple[bytes, Position]]
) -> list[str]:
    """Waits (30 s at most) for the MQTT session and the SSE stream to have every
    acknowledged message of their subject, stops them, and says what is wrong
    (:func:`stream_problems`)."""
    contents = {c for c, _ in acked}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (
        contents <= set(mqtt.payloads) and contents <= set(sse_messages(sse.events))
    ):
        time.sleep(0.2)
    mqtt.done.set()
    sse.done.set()
    mqtt.join(10)
    sse.join(10)
    return stream_problems(list(mqtt.payloads), list(mqtt.sessions),
                           sse_messages(sse.events), list(sse.streams), acked)


def sse_messages(events: list[dict[str, object]]) -> list[bytes]:
    return [e["data"]["content"].encode() for e in events  # type: ignore[index]
            if e["event"] == "message"] + [b"resync" for e in events if e["event"] == "resync"]


def stream_problems(
    payloads: list[bytes],
    sessions: list[tuple[int, bool]],
    sse: list[bytes],
    streams: list[int],
    acked: list[tuple[bytes, Position]],
) -> list[str]:
    """The MQTT session (QoS 1: repeats allowed) and the SSE stream (exactly once; a
    resync shows as ``b"resync"``) got every acknowledged message in order; the session
    was found again at every reconnection, and both did reconnect."""
    position_of = dict(acked)
    out = [f"mqtt lost {c!r}" for c in position_of if c not in set(payloads)][:5]
    firsts = [position_of[c] for c in dict.fromkeys(payloads) if c in position_of]
    if firsts != sorted(firsts):
        out.append("mqtt out of order")
    if len(sessions) < 2 or not all(present for _, present in sessions[1:]):
        out.append(f"mqtt sessions {sessions}")
    if len(sse) != len(set(sse)) or b"resync" in sse:
        out.append("sse twice or resync")
    order = [position_of[c] for c in sse if c in position_of]
    if order != sorted(order):
        out.append("sse out of order")
    out += [f"sse lost {c!r}" for c in position_of if c not in set(sse)][:5]
    if len(streams) < 2:
        out.append(f"sse streams {streams}")
    return out
