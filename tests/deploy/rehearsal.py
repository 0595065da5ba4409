"""A local StatefulSet rehearsal of deploy/k8s, under publish load with SDK clients.

    unshare --net -- .venv/bin/python tests/deploy/rehearsal.py --out DIR

(root: pods are network namespaces; see k8s_local.py). Reads the rendered install
(``kubectl kustomize deploy/k8s``), starts the StatefulSet's pods as local processes
with each pod's hostname, environment, config and volume, and performs, while SDK
publishers and subscribers go through the client Service:

1. the first start: all pods at once (``Parallel``);
2. HPA scale 3 -> 6 -> 3, removing the highest ordinal first, one at a time, each
   with the preStop hook and the drain (their volumes as ``whenScaled`` says);
3. a rolling restart of every pod in reverse ordinal order, one at a time, each
   waiting for the previous to be ready and never taking a seed while the PDB would
   be broken;
4. a seed pod deleted and recreated with its volume (and a new IP).

It checks that no pod exits on its own or needs SIGKILL, that no acknowledged publish
is lost, that every subscriber that was moved resumed with DATA_SYNC and none got
DATA_RESYNC, and that no publish outcome was left unknown. Writes ``summary.json``
into DIR and exits 1 on a violation.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio
from k8s_local import GATEWAY, SERVICE_PORT, LocalStatefulSet
from k8s_manifests import documents, find, running_replicas

from migratory.model.message import MessageType
from migratory.model.position import Position
from migratory.protocol.ops import PUBLISH_ELSEWHERE
from migratory_client import (
    Client,
    NotConnectedError,
    NotificationStatus,
    PublishOutcomeUnknown,
    ReconnectPolicy,
    connect,
)

SUBJECT = "/Rehearsal/StatefulSet/A"
SERVICE = f"ws://{GATEWAY}:{SERVICE_PORT}"
POLICY = ReconnectPolicy(initial_delay=0.1, max_delay=1.0, connect_timeout=5.0)
PUBLISHERS = ("p00", "p01", "p10", "p11")
"""The publishers' names (their contents' prefix): two on each of two clients."""
SUBSCRIBED_WITHIN = 60.0
"""Seconds for every subscriber to be subscribed through the Service: a hang guard."""


@dataclass
class Subscriber:
    server: str = SERVICE
    """Where it connects, and connects again after each move: the client Service, or
    the Service's port pinned to the Raft leader (k8s_local.LEADER_PORT)."""
    received: list[tuple[bytes, MessageType, Position]] = field(default_factory=list)
    statuses: list[NotificationStatus] = field(default_factory=list)
    status_times: list[float] = field(default_factory=list)  # (of each of ``statuses``)
    timeline: list[str] = field(default_factory=list)
    """Each notification (time, status, member, position, the SDK's reason) and the
    position of the last message before it, with when it came: what a violation's report
    shows of this subscriber."""
    last_at: float | None = None  # when the last message came
    longest_gap: float = 0.0
    """The longest time between two messages (the publishers publish all along: a
    subscriber that stops receiving shows here, and its timeline says where it was)."""


@dataclass
class Load:
    acked: dict[bytes, Position] = field(default_factory=dict)
    republished: int = 0
    failed: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    not_connected: int = 0  # publishes not sent: no session within their timeout
    acked_by: dict[str, int] = field(default_factory=dict)  # per publisher, its count
    flowing_seconds: float | None = None  # until it flowed before the play's body


FLOWING_ACKS = 5
"""Publishes each publisher has acknowledged, and messages each subscriber receives, for
:func:`flowing` to say the load goes through the cluster (about 0.3 s on a quiet box)."""
ACKNOWLEDGED_AT_LEAST = 100
"""Publishes a play must have acknowledged (:func:`check`): a play's end waits for them
(scaling_faults.flowing_again) as well as for its publishers' :data:`FLOWING_ACKS`.
Without, whole-crash-loop, whose fault leaves no majority for most of the play, had 94
in all at load ~30 (the 2-4 s of fixed sleeps before and after gave it more)."""
FLOWING_WITHIN = 30.0
"""Seconds :func:`flowing` waits at most: then the play goes on (as it did after the
fixed sleep this wait replaced), and its checks say what did not flow."""


async def flowing(load: Load, subscribers: Sequence[Subscriber] = (), *,
                  acknowledged: int = 0) -> float:
    """Until each publisher has :data:`FLOWING_ACKS` more publishes acknowledged, and each
    of ``subscribers`` that many more messages (and ``acknowledged`` publishes are in
    all): the load goes through the cluster as it stands, end to end. What a play waits
    for before its fault and once the cluster is back, instead of a fixed 1-3 s (more
    than a quiet box needs, and not always enough on a busy one). The seconds it
    waited."""
    began = trio.current_time()
    acked = {name: load.acked_by.get(name, 0) + FLOWING_ACKS for name in PUBLISHERS}
    received = [(sub, len(sub.received) + FLOWING_ACKS) for sub in subscribers]

    def flows() -> bool:
        return (len(load.acked) >= acknowledged
                and all(load.acked_by.get(name, 0) >= n for name, n in acked.items())
                and all(len(sub.received) >= n for sub, n in received))

    with trio.move_on_after(FLOWING_WITHIN):
        while not flows():
            await trio.sleep(0.05)
    return trio.current_time() - began


async def subscriber(sub: Subscriber, stop: trio.Event) -> None:
    async with (
        connect([sub.server], reconnect=POLICY) as client,
        client.subscribe(SUBJECT) as subscription,
        trio.open_nursery() as nursery,
    ):

        async def notes() -> None:
            async for note in client.notifications():
                sub.statuses.append(note.status)
                sub.status_times.append(trio.current_time())
                last = sub.received[-1][2] if sub.received else None
                at = "" if sub.last_at is None else f" at {sub.last_at:.2f}"
                sub.timeline.append(
                    f"{trio.current_time():.2f} {note.status} {note.server} {note.position} "
                    f"(last message {last}{at}, {len(sub.received)} received)"
                    + (f": {note.reason}" if note.reason else ""))

        nursery.start_soon(notes)
        while not stop.is_set():
            with trio.move_on_after(0.2):
                message = await subscription.__anext__()
                sub.received.append((message.content, message.type, message.position))
                if sub.last_at is not None:
                    sub.longest_gap = max(sub.longest_gap, trio.current_time() - sub.last_at)
                sub.last_at = trio.current_time()
        nursery.cancel_scope.cancel()


async def publisher(client: Client, name: str, load: Load, stop: trio.Event) -> None:
    number = 0
    while not stop.is_set():
        content = f"{name}-{number:06d}".encode()
        try:
            result = await client.publish(SUBJECT, content, timeout=20)
        except PublishOutcomeUnknown as exc:
            load.unknown.append(f"{content!r}: {exc}")
            number += 1
            continue
        except NotConnectedError:  # no ready member behind the Service: not sent
            load.not_connected += 1
            continue
        if result.ok:
            assert result.position is not None
            load.acked[content] = result.position
            load.acked_by[name] = load.acked_by.get(name, 0) + 1
            number += 1
        elif result.reason == PUBLISH_ELSEWHERE or "DRAINED" in (result.reason or ""):
            load.republished += 1  # definitely not published: publish it again
        else:
            load.failed.append(f"{content!r}: {result.reason}")
            number += 1
        await trio.sleep(0.02)


async def publishing_client(*, task_status: trio.TaskStatus[Client] = trio.TASK_STATUS_IGNORED
                            ) -> None:
    async with connect([SERVICE], reconnect=POLICY) as client:
        await client.wait_connected()
        task_status.started(client)
        await trio.sleep_forever()


async def scenario(sts: LocalStatefulSet, phases: list[dict[str, object]], load: Load
                   ) -> None:
    hpa = find(sts.docs, "HorizontalPodAutoscaler")["spec"]
    pdb = find(sts.docs, "PodDisruptionBudget")["spec"]
    seeds = [int(v) for v in pdb["selector"]["matchExpressions"][0]["values"]]
    start, low = running_replicas(sts.docs), hpa["minReplicas"]
    high = min(hpa["maxReplicas"], 6)

    async def phase(name: str, body: object) -> None:
        began = trio.current_time()
        sts.events.note(f"phase: {name}")
        await body  # type: ignore[misc]
        phases.append({"phase": name, "seconds": round(trio.current_time() - began, 1)})

    async def scale_up() -> None:
        for ordinal in range(len(sts.pods), high):
            await sts.create(ordinal)
        await sts.wait_ready(range(high), 90)

    async def scale_down() -> None:
        for ordinal in range(high - 1, low - 1, -1):  # highest ordinal first
            await sts.delete(ordinal, delete_volume=sts.claims_deleted_when_scaled)
            await trio.sleep(1)

    async def rolling_restart() -> None:
        for ordinal in sorted(sts.pods, reverse=True):
            if ordinal in seeds:  # the PDB: the other seeds must be ready
                others = sum(1 for s in seeds if s != ordinal and sts.pods[s].ready)
                assert others >= pdb["minAvailable"], f"PDB would be broken by {ordinal}"
            await sts.delete(ordinal)
            await sts.create(ordinal)
            await sts.wait_ready([ordinal], 90)

    async def seed_recreated() -> None:
        await sts.delete(seeds[1])
        await sts.create(seeds[1])
        await sts.wait_ready(range(low), 90)

    async def flowed() -> None:  # (each phase was followed by a fixed 2-3 s)
        sts.events.note(f"the load flowed again in {await flowing(load):.2f} s")

    await phase(f"HPA scale {start} -> {high}", scale_up())
    await flowed()
    await phase(f"HPA scale {high} -> {low}", scale_down())
    await flowed()
    await phase("rolling restart, reverse ordinal order", rolling_restart())
    await flowed()
    await phase(f"seed pod {seeds[1]} deleted and recreated", seed_recreated())
    await flowed()


async def under_load(subscribers: list[Subscriber], load: Load,
                     body: Callable[[], Awaitable[None]]) -> None:
    """Run ``body`` while the subscribers and two publishing clients (two publishers
    each) go through the client Service, once the load flows (:func:`flowing`); then let
    the subscribers catch up (30 s at most) with every acknowledged publish. The
    publishers start once every subscriber is subscribed (its SUBSCRIBE_ALLOW): every
    acknowledged publish is then one it must get (it waited a fixed 2 s, more than a
    quiet box needs and not always enough on a busy one)."""
    stop_subscribers, stop_publishers = trio.Event(), trio.Event()
    async with trio.open_nursery() as subs:
        for sub in subscribers:
            subs.start_soon(subscriber, sub, stop_subscribers)
        with trio.fail_after(SUBSCRIBED_WITHIN):
            while not all(NotificationStatus.SUBSCRIBE_ALLOW in s.statuses for s in subscribers):
                await trio.sleep(0.05)
        async with trio.open_nursery() as clients:
            async with trio.open_nursery() as pubs:
                for n in range(2):
                    client = await clients.start(publishing_client)
                    for task in range(2):
                        pubs.start_soon(publisher, client, PUBLISHERS[2 * n + task], load,
                                        stop_publishers)
                # before the body: what it disturbs
                load.flowing_seconds = await flowing(load, subscribers)
                await body()
                stop_publishers.set()
            clients.cancel_scope.cancel()
        with trio.move_on_after(30):
            while not all(set(load.acked) <= {c for c, _, _ in s.received}
                          for s in subscribers):
                await trio.sleep(0.2)
        stop_subscribers.set()


async def rehearse(out: Path, time_scale: float) -> dict[str, object]:
    LocalStatefulSet.make_network()
    docs = documents()
    sts = LocalStatefulSet(docs, out / "pods", secrets.token_urlsafe(24), time_scale=time_scale)
    subscribers = [Subscriber() for _ in range(8)]
    load = Load()
    phases: list[dict[str, object]] = []
    try:
        async with trio.open_nursery() as cluster:
            cluster.start_soon(sts.kubelet)
            await cluster.start(sts.service)
            began = trio.current_time()
            replicas = running_replicas(docs)
            await sts.scale(replicas)  # Parallel: all at once
            await sts.wait_ready(range(replicas), 90)
            phases.append({"phase": f"first start, {replicas} pods at once",
                           "seconds": round(trio.current_time() - began, 1)})
            await under_load(subscribers, load, lambda: scenario(sts, phases, load))
            cluster.cancel_scope.cancel()
    finally:
        sts.stop_all()
    return check(sts, subscribers, load, phases)


def check(sts: LocalStatefulSet, subscribers: list[Subscriber], load: Load,
          phases: list[dict[str, object]], *, outcomes_may_be_unknown: bool = False
          ) -> dict[str, object]:
    """The violations of the guarantees; ``outcomes_may_be_unknown``: the play left the
    cluster without a Raft majority for a while, where a publish in flight cannot be
    settled (an unknown outcome is then the honest answer, a wrong one never is)."""
    violations = list(sts.events.violations)
    if load.unknown and not outcomes_may_be_unknown:
        violations.append(f"{len(load.unknown)} publish outcomes unknown: {load.unknown[:3]}")
    if len(load.acked) < ACKNOWLEDGED_AT_LEAST:
        violations.append(f"only {len(load.acked)} publishes acknowledged")
    moved = 0
    for n, sub in enumerate(subscribers):
        updates = [(c, p) for c, kind, p in sub.received if kind is not MessageType.SNAPSHOT]
        contents = [c for c, _ in updates]
        positions = [p for _, p in updates]
        lost = set(load.acked) - set(contents)
        if lost:
            violations.append(f"subscriber {n}: {len(lost)} acknowledged publishes lost")
        if len(contents) != len(set(contents)) or positions != sorted(positions):
            violations.append(f"subscriber {n}: a duplicate or out-of-order delivery")
        if NotificationStatus.DATA_RESYNC in sub.statuses:
            violations.append(f"subscriber {n}: DATA_RESYNC")
        if NotificationStatus.SERVER_DOWN in sub.statuses:
            moved += 1
            if NotificationStatus.DATA_SYNC not in sub.statuses:
                violations.append(f"subscriber {n}: moved without DATA_SYNC")
    return {
        "violations": violations,
        "phases": phases,
        **resume_figures(subscribers),
        "acknowledged": len(load.acked),
        "flowing_before_seconds": load.flowing_seconds,
        "republished_after_refusal": load.republished,
        "not_sent_no_member_ready": load.not_connected,
        "failed": load.failed[:10],
        "unknown": len(load.unknown),
        "subscribers": len(subscribers),
        "subscriber_moves": sum(s.statuses.count(NotificationStatus.SERVER_DOWN)
                                for s in subscribers),
        "subscribers_moved": moved,
        "data_sync": sum(s.statuses.count(NotificationStatus.DATA_SYNC) for s in subscribers),
        "data_resync": sum(s.statuses.count(NotificationStatus.DATA_RESYNC)
                           for s in subscribers),
        "events": sts.events.log,
        # the notifications of every subscriber a violation names
        "subscriber_timelines": {
            n: sub.timeline[-20:] for n, sub in enumerate(subscribers)
            if any(v.startswith(f"subscriber {n}:") for v in violations)
        },
    }


def resume_figures(subscribers: list[Subscriber]) -> dict[str, list[float]]:
    """Each subscriber's moves, and how near its resumes came to what the members'
    caches hold (``MaxCachedMessagesPerSubject``, 1000 by default: a resume missing more
    is answered with the snapshot and DATA_RESYNC): the most messages one resume
    recovered, and the longest time from a SERVER_DOWN to the resume's DATA_SYNC or
    DATA_RESYNC."""
    bursts, waits = [], []
    answers = (NotificationStatus.DATA_SYNC, NotificationStatus.DATA_RESYNC)
    for sub in subscribers:
        largest = run = 0
        for _, kind, _ in sub.received:
            run = run + 1 if kind is MessageType.RECOVERED else 0
            largest = max(largest, run)
        bursts.append(largest)
        wait, down = 0.0, None
        for status, at in zip(sub.statuses, sub.status_times, strict=True):
            if status is NotificationStatus.SERVER_DOWN and down is None:
                down = at
            elif status in answers and down is not None:
                wait, down = max(wait, at - down), None
        waits.append(round(wait, 2))
    return {"moves_per_subscriber": [s.statuses.count(NotificationStatus.SERVER_DOWN)
                                     for s in subscribers],
            "longest_gap_per_subscriber": [round(s.longest_gap, 2) for s in subscribers],
            "largest_recovered_per_subscriber": bursts, "longest_resume_seconds": waits}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="multiply the manifest's probe periods, preStop and grace")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    summary = trio.run(rehearse, args.out, args.time_scale)
    summary["seconds"] = round(time.monotonic() - started, 1)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "events"}, indent=2))
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
