"""Issue 8: a non-seed and its upstream seed, with real member processes under load.

- **Ready before it has data**: a restarted non-seed answered ``/readyz`` 200 at
  applied clsn 0 while the seeds were thousands further (readiness compared against
  a heartbeat the seed sent only after replaying its ring), and a fresh subscriber
  there received old messages as live updates. Now: whenever it says ready, its
  applied clsn is at least where the seeds were when it restarted, and a fresh
  subscriber starts from there.
- **A stopped upstream is noticed**: a non-seed whose seed was SIGSTOPped waited
  forever, "ready", its subscribers silently stalled. Now it is not ready within
  seconds, replicates from another seed, and its subscribers keep receiving.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_fixture import LocalCluster
from cluster_load import LoadPublisher, LoadSubscriber, delivery_problems

from cluster.upstream import UPSTREAM_SILENCE
from migratory.model.message import MessageType

NON_SEED = 3


@pytest.fixture
def cluster4(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path, members=4, seeds=3)
    cluster.start_all()
    try:
        cluster.wait_ready(timeout=40)
        yield cluster
    finally:
        cluster.stop()


class StatusPoller(threading.Thread):
    """Asks a member for ``/cluster`` as fast as it answers (ready and applied clsn
    come from one snapshot) until stopped."""

    def __init__(self, cluster: LocalCluster, index: int) -> None:
        super().__init__(daemon=True)
        self.url = f"{cluster.http(index)}/cluster"
        self.samples: list[dict[str, Any]] = []
        self.done = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + 40
        while not self.done.is_set() and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url, timeout=2) as reply:
                    self.samples.append(json.loads(reply.read()))
            except (OSError, ValueError):
                time.sleep(0.005)


@pytest.mark.slow
def test_a_restarted_non_seed_is_not_ready_before_it_has_the_data(
    cluster4: LocalCluster,
) -> None:
    publisher = LoadPublisher([cluster4.port(0)], rate=1500, duration=30)
    publisher.start()
    publisher.wait_acked(3000, timeout=10)
    cluster4.kill(NON_SEED)
    time.sleep(2)  # more to catch up with
    seeds_at = max(cluster4.status(i)["applied_clsn"] for i in range(3))
    acked_before = {s: m[-1][1] for s, m in publisher.acked_messages().items()}
    pollers = [StatusPoller(cluster4, NON_SEED) for _ in range(3)]
    for poller in pollers:
        poller.start()
    cluster4.start(NON_SEED)
    subscriber = LoadSubscriber([cluster4.port(NON_SEED)], duration=40, retry=0.01)
    subscriber.start()  # dials until the member lets it in
    cluster4.wait_ready([NON_SEED], timeout=30)
    time.sleep(0.5)
    for poller in pollers:
        poller.done.set()
        poller.join(5)
    samples = [s for poller in pollers for s in poller.samples]
    ready = [s["applied_clsn"] for s in samples if s["ready"]]
    not_ready = [s["applied_clsn"] for s in samples if not s["ready"]]
    assert ready and min(ready) >= seeds_at, (sorted(ready)[:3], seeds_at)

    subscriber.wait_subscribed(15)
    time.sleep(2)
    publisher.stop()
    acked = publisher.acked_messages()
    for subject, start in subscriber.started.items():
        assert start.epoch == acked_before[subject].epoch
        assert start.seq >= acked_before[subject].seq, (subject, start, acked_before[subject])
    expected = {
        content
        for subject, messages in acked.items()
        for content, position in messages
        if position > subscriber.started[subject]
    }
    subscriber.wait_for(expected, 20)
    subscriber.stop()
    updates = [m for m in subscriber.messages() if m.type is MessageType.UPDATE]
    assert all(m.position > subscriber.started[m.subject] for m in updates), "old as live"
    assert delivery_problems(subscriber.messages(), acked, after=subscriber.started) == []
    assert cluster4.exited() == {}
    print(f"seeds at clsn {seeds_at} at the restart; {len(samples)} samples, "
          f"{len(not_ready)} not ready (clsn {min(not_ready, default=None)}.."
          f"{max(not_ready, default=None)}), first ready at {min(ready)}; "
          f"{len(subscriber.errors)} refused connections first; {publisher.summary()}")


def seed_index(cluster: LocalCluster, name: str | None) -> int:
    return next(i for i in range(3) if cluster.settings[i]["ClusterMemberListen"] == name)


@pytest.mark.slow
def test_a_stopped_upstream_seed_is_noticed_and_replaced(cluster4: LocalCluster) -> None:
    upstream = seed_index(cluster4, cluster4.status(NON_SEED)["replicating_from"])
    via = next(i for i in range(3) if i != upstream)
    subscriber = LoadSubscriber([cluster4.port(NON_SEED)], duration=40)
    subscriber.start()
    subscriber.wait_subscribed(10)
    publisher = LoadPublisher([cluster4.port(via)], rate=1500, duration=30)
    publisher.start()
    publisher.wait_acked(2000, timeout=10)
    stopped = cluster4.processes[upstream]
    assert stopped is not None
    stopped.send_signal(signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        samples: list[tuple[float, dict[str, Any]]] = []
        while time.monotonic() < stopped_at + 15:
            status = cluster4.status(NON_SEED)
            samples.append((time.monotonic() - stopped_at, status))
            source = status["replicating_from"]
            if status["ready"] and source not in (None, cluster4.settings[upstream][
                    "ClusterMemberListen"]):
                break
            time.sleep(0.05)
        switched_after, switched = samples[-1]
        assert switched["ready"] and seed_index(cluster4, switched["replicating_from"]) != upstream
        assert switched_after < 2 * UPSTREAM_SILENCE + 2, switched_after
        reasons = {s["not_ready_reason"] for _, s in samples if not s["ready"]}
        assert reasons, "ready all along while its seed was stopped"
        deadline = time.monotonic() + 10  # (a fixed 2 s at 1,500/s: twice what it needs)
        while (len(subscriber.messages(since=stopped_at + switched_after)) <= 1000
               and time.monotonic() < deadline):
            time.sleep(0.05)
        publisher.stop()
    finally:
        stopped.send_signal(signal.SIGCONT)
    acked = publisher.acked_messages()
    subscriber.wait_for({c for messages in acked.values() for c, _ in messages}, 20)
    subscriber.stop()
    assert delivery_problems(subscriber.messages(), acked) == []
    after_switch = subscriber.messages(since=stopped_at + switched_after)
    assert len(after_switch) > 1000  # kept receiving from the new seed
    assert subscriber.closes == [], "its clients were sent away"
    non_seed_log = cluster4.log(NON_SEED)
    upstream_name = cluster4.settings[upstream]["ClusterMemberListen"]
    assert f"leaving seed {upstream_name}: nothing from it for" in non_seed_log
    cluster4.wait_ready(timeout=20)
    assert cluster4.exited() == {}
    print(f"switched after {switched_after:.2f} s; not ready meanwhile: {min(reasons)} .. "
          f"{max(reasons)}; "
          f"{publisher.summary()}")
