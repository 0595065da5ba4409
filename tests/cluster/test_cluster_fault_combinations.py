"""Combinations of faults no single-fault test names, with real member processes.

Each test runs the raw load of :mod:`cluster_load` through a fault made of two parts
and checks the guarantee with its checker (:func:`cluster_load.delivery_problems`),
:func:`answer_problems` and :func:`order_inversions`: every ``PUBLISH_OK`` delivered at
its position to every subscriber, in order, once, no silent gap, no ``DATA_RESYNC``
while the caches reach back; no publish failed for sure ("not published") that any
subscriber received; each publisher's acknowledged messages numbered in the order it
published them.

- a non-seed joining (its first cache sync) while the Raft leader is SIGKILLed;
- the Raft leader SIGSTOPped past its election timeout with a publisher and a
  subscriber on it, then resumed while a subscriber from a member further ahead
  resumes on it;
- a publisher on a non-seed whose upstream seed is SIGKILLed mid-burst, so its
  forwarded publishes are in flight;
- the link between that non-seed and its upstream stalled mid-burst (:meth:`TcpGate.hold`)
  until the non-seed moved on, then delivering what it held. Before the coordinator
  numbered each member's publishes in their order (``Coordinator.in_origin_order``), the
  seed submitted those late forwards and they were numbered after the newer publishes the
  non-seed had forwarded through the next seed (a publisher's 2056th message after its
  4580th, its older value the subject's snapshot); the same with the seed SIGSTOPped for
  3 s instead, in about half the runs;
- every Raft link between the seeds, and the leader's cluster links, stalled 3 s under
  load, then delivering everything at once. Before a busy link carried heartbeats
  (cluster/peers.py), the non-seed, having linked to a seed while it was not ready,
  stayed not ready for as long as the load lasted (30 s, about one run in three).
"""

from __future__ import annotations

import itertools
import json
import signal
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from cluster_fixture import LocalCluster
from cluster_load import LoadPublisher, LoadSubscriber, delivery_problems
from gated_seeds import seed_index, started_behind_gates

from migratory.model.position import Position
from migratory.protocol import ops

SEEDS = [0, 1, 2]
NON_SEED = 3
CACHE = "20000"
"""MaxCachedMessagesPerSubject: every resume in these tests reaches back (DATA_SYNC)."""
BAD_LOG_LINES = ("Traceback", "older than applied", "names two messages")


def answer_problems(
    publishers: Iterable[LoadPublisher], subscribers: Iterable[LoadSubscriber]
) -> list[str]:
    """A publish failed for sure (anything but "outcome unknown"; or left without an
    answer by a drain's close, which says it was not taken) that a subscriber received,
    or a delivery nobody published."""
    problems = []
    delivered = {m.content for s in subscribers for m in s.messages()}
    sent: set[bytes] = set()
    for publisher in publishers:
        sent |= {content for _, content in publisher.sent.values()}
        for closure, reason in publisher.failed.items():
            content = publisher.sent[closure][1]
            if content in delivered and "outcome unknown" not in reason:
                problems.append(f"{content!r} failed ({reason}) and was delivered")
        for closure in publisher.not_published:  # (a drain's close came before an answer)
            if (content := publisher.sent[closure][1]) in delivered:
                problems.append(f"{content!r} not published (a drain's close), delivered")
    problems += [f"{c!r} delivered, never sent" for c in delivered - sent]
    return problems


def merged_acks(publishers: Iterable[LoadPublisher]) -> dict[str, list[tuple[bytes, Position]]]:
    acked: dict[str, list[tuple[bytes, Position]]] = {}
    for publisher in publishers:
        for subject, messages in publisher.acked_messages().items():
            acked.setdefault(subject, []).extend(messages)
    for messages in acked.values():
        messages.sort(key=lambda item: (item[1].epoch, item[1].seq))
    return acked


def failure_reasons(publisher: LoadPublisher) -> dict[str, int]:
    """How many publishes failed for each reason (its words before any detail)."""
    reasons: dict[str, int] = {}
    for reason in publisher.failed.values():
        short = reason.split(": ", 1)[-1].split(" (")[0][:60]
        reasons[short] = reasons.get(short, 0) + 1
    return reasons


def order_inversions(publisher: LoadPublisher) -> list[str]:
    """Acknowledged publishes of one subject numbered in another order than published."""
    out = []
    for subject, messages in publisher.acked_messages().items():
        numbers = [int(c.split(b"|")[0].removeprefix(publisher.tag.encode()))
                   for c, _ in messages]
        out += [f"{subject}: {a} before {b}" for a, b in itertools.pairwise(numbers)
                if a > b]
    return out


def upstream_of(cluster: LocalCluster, index: int, timeout: float = 15) -> int:
    """The seed the non-seed ``index`` replicates from, once it has one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            seed = seed_index(cluster, cluster.status(index)["replicating_from"])
        except OSError:
            seed = None
        if seed is not None:
            return seed
        time.sleep(0.02)
    raise TimeoutError(f"member {index} replicates from no seed")


def check_everything(
    cluster: LocalCluster,
    publishers: list[LoadPublisher],
    subscribers: list[LoadSubscriber],
    killed: set[int],
    starts: dict[str, dict[str, Position]] | None = None,
) -> None:
    """Every acknowledged publish delivered to every subscriber (after its start), the
    failures truthful, no DATA_RESYNC, no member gone on its own, no bad log line."""
    acked = merged_acks(publishers)
    contents = {c for messages in acked.values() for c, _ in messages}
    starts = starts or {}
    for subscriber in subscribers:
        after = starts.get(subscriber.tag)
        subscriber.wait_for(contents if after is None else {
            c for s, messages in acked.items() for c, p in messages if p > after[s]
        }, 30)
    for subscriber in subscribers:
        subscriber.stop()
        problems = delivery_problems(subscriber.messages(), acked, after=starts.get(subscriber.tag))
        assert problems == [], (subscriber.tag, problems[:10])
        assert subscriber.statuses(ops.Status.DATA_RESYNC) == [], subscriber.tag
    assert answer_problems(publishers, subscribers) == []
    for publisher in publishers:
        assert order_inversions(publisher) == [], order_inversions(publisher)[:5]
    assert {i for i, code in cluster.exited().items() if code} == killed, cluster.exited()
    for i in range(cluster.members):
        text = cluster.log(i)
        assert not [bad for bad in BAD_LOG_LINES if bad in text], f"member {i}:\n{text[-3000:]}"


@pytest.mark.slow
def test_a_non_seed_joining_while_the_leader_is_killed(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=4, seeds=3, MaxCachedMessagesPerSubject=CACHE)
    try:
        cluster.start_all(SEEDS)
        cluster.wait_ready(SEEDS, timeout=40)
        leader = cluster.leader()
        followers = [i for i in SEEDS if i != leader]
        ports = [cluster.port(i) for i in followers]
        watcher = LoadSubscriber(ports, tag="watcher", duration=60)
        watcher.start()
        watcher.wait_subscribed(10)
        publisher = LoadPublisher(ports, rate=1000, duration=40)
        publisher.start()
        publisher.wait_acked(3000, timeout=15)
        resume_from = {s: m[len(m) // 2][1] for s, m in publisher.acked_messages().items()}

        cluster.start(NON_SEED)
        upstream = upstream_of(cluster, NON_SEED)  # its first sync is on the way
        cluster.kill(leader)
        joiner = LoadSubscriber(
            [cluster.port(NON_SEED)], positions=resume_from, tag="joiner", retry=0.05
        )
        joiner.start()
        cluster.wait_ready([*followers, NON_SEED], timeout=30)
        joiner.wait_subscribed(15)
        time.sleep(2)
        publisher.stop()
        check_everything(
            cluster, [publisher], [watcher, joiner], {leader}, starts={"joiner": resume_from}
        )
        assert {s.status for s in joiner.statuses()} <= {
            ops.Status.SUBSCRIBE_ALLOW, ops.Status.DATA_SYNC
        }, joiner.statuses()[-5:]
        cluster.wait_same_applied([*followers, NON_SEED])
        print(f"joiner's first upstream {upstream} (leader {leader}); {publisher.summary()}")
    finally:
        cluster.stop()


@pytest.mark.slow
def test_a_leader_stopped_past_its_election_timeout_resumes_with_clients_on_it(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path, members=4, seeds=3, MaxCachedMessagesPerSubject=CACHE)
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=40)
        leader = cluster.leader()
        on_leader = LoadSubscriber([cluster.port(leader)], tag="on-leader", duration=60)
        elsewhere = LoadSubscriber([cluster.port(NON_SEED)], tag="elsewhere", duration=60)
        for subscriber in (on_leader, elsewhere):
            subscriber.start()
            subscriber.wait_subscribed(10)
        # one publisher through the leader (its publishes wait in its socket while it is
        # stopped), one through the non-seed (the others go on without it)
        publishers = [
            LoadPublisher([cluster.port(leader)], rate=500, duration=40, tag="a"),
            LoadPublisher([cluster.port(NON_SEED)], rate=500, duration=40, tag="b"),
        ]
        for publisher in publishers:
            publisher.start()
            publisher.wait_acked(1000, timeout=15)

        stopped = cluster.processes[leader]
        assert stopped is not None
        stopped.send_signal(signal.SIGSTOP)
        try:
            time.sleep(2.0)  # 7-13 election timeouts: the others elect, publish on
            ahead = dict(elsewhere.positions)
        finally:
            stopped.send_signal(signal.SIGCONT)
        late = LoadSubscriber([cluster.port(leader)], positions=ahead, tag="late", duration=60)
        late.start()
        late.wait_subscribed(15)
        time.sleep(3)
        for publisher in publishers:
            publisher.stop()
        check_everything(
            cluster, publishers, [on_leader, elsewhere, late], set(), starts={"late": ahead}
        )
        cluster.wait_same_applied(range(4))
        print(f"late subscriber from {ahead}; " + "; ".join(
            f"{p.summary()} {failure_reasons(p)}" for p in publishers
        ) + f"; on-leader closes {on_leader.closes}")
    finally:
        cluster.stop()


@pytest.mark.slow
def test_a_non_seeds_upstream_killed_mid_burst(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=4, seeds=3, MaxCachedMessagesPerSubject=CACHE)
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=40)
        upstream = upstream_of(cluster, NON_SEED)
        watch_on = [i for i in SEEDS if i != upstream]
        watcher = LoadSubscriber([cluster.port(i) for i in watch_on], tag="watcher",
                                 duration=60)
        local = LoadSubscriber([cluster.port(NON_SEED)], tag="local", duration=60)
        for subscriber in (watcher, local):
            subscriber.start()
            subscriber.wait_subscribed(10)
        publisher = LoadPublisher([cluster.port(NON_SEED)], rate=1500, duration=40)
        publisher.start()
        publisher.wait_acked(3000, timeout=15)
        cluster.kill(upstream)
        cluster.start(upstream)
        cluster.wait_ready(timeout=30)
        assert upstream_of(cluster, NON_SEED) != upstream
        publisher.wait_acked(len(publisher.acked) + 1500, timeout=15)
        publisher.stop()
        assert publisher.unanswered == set(), publisher.summary()
        assert len(publisher.failed) < 0.2 * len(publisher.sent), publisher.summary()
        check_everything(cluster, [publisher], [watcher, local], set())
        print(f"upstream {upstream} killed; {publisher.summary()}; failures "
              f"{failure_reasons(publisher)}")
    finally:
        cluster.stop()


@pytest.mark.slow
def test_a_non_seeds_forwards_delivered_late_after_it_moved_on(tmp_path: Path) -> None:
    """The link between a non-seed and its upstream seed stalls (both ways, nothing lost)
    mid-burst: the non-seed leaves it after 2 s of silence and forwards its next
    publishes through another seed; then the stalled link delivers what the non-seed had
    forwarded before, and its close, to the first seed -- alive all along."""
    cluster = LocalCluster(tmp_path, members=4, seeds=3, MaxCachedMessagesPerSubject=CACHE)
    with started_behind_gates(cluster) as gates:
        upstream = upstream_of(cluster, NON_SEED)
        watcher = LoadSubscriber([cluster.port(i) for i in SEEDS], tag="watcher", duration=60)
        watcher.start()
        watcher.wait_subscribed(10)
        publisher = LoadPublisher([cluster.port(NON_SEED)], rate=1000, duration=40)
        publisher.start()
        publisher.wait_acked(2000, timeout=15)
        gates[upstream][0].hold()
        try:
            deadline = time.monotonic() + 10
            while upstream_of(cluster, NON_SEED) == upstream:
                assert time.monotonic() < deadline, "the non-seed did not leave its seed"
                time.sleep(0.05)
            publisher.wait_acked(len(publisher.acked) + 500, timeout=15)
        finally:
            gates[upstream][0].release()
        publisher.wait_acked(len(publisher.acked) + 500, timeout=15)
        publisher.stop()
        check_everything(cluster, [publisher], [watcher], set())
        print(f"{publisher.summary()}; failures {failure_reasons(publisher)}")


@pytest.mark.slow
def test_every_raft_link_stalled_then_delivered_late_under_load(tmp_path: Path) -> None:
    """Every Raft connection between the seeds stalls both ways for 3 s (nothing lost,
    nothing delivered: the followers time out, stand, and their votes and the leader's
    appends wait in the stalled links), with the leader's cluster links stalled too (its
    non-seed leaves it); then everything held is delivered at once, old terms mixed with
    new ones. Publishes go on through both seeds' links and the non-seed throughout."""
    cluster = LocalCluster(tmp_path, members=4, seeds=3, MaxCachedMessagesPerSubject=CACHE)
    with started_behind_gates(cluster) as gates:
        leader = cluster.leader()
        others = [i for i in SEEDS if i != leader]
        subscribers = [
            LoadSubscriber([cluster.port(i) for i in [NON_SEED, *others]], tag="non-seed",
                           duration=60),
            LoadSubscriber([cluster.port(i) for i in [leader, *others]], tag="leader",
                           duration=60),
        ]
        for subscriber in subscribers:
            subscriber.start()
            subscriber.wait_subscribed(10)
        publishers = [
            LoadPublisher([cluster.port(i) for i in [NON_SEED, *others]], rate=400,
                          duration=40, tag="n"),
            LoadPublisher([cluster.port(i) for i in [leader, *others]], rate=400,
                          duration=40, tag="l"),
        ]
        for publisher in publishers:
            publisher.start()
            publisher.wait_acked(800, timeout=15)
        held = [gates[i][1] for i in SEEDS] + [gates[leader][0]]
        for gate in held:
            gate.hold()
        try:
            time.sleep(3.0)
        finally:
            for gate in held:
                gate.release(settle=0.0)
        try:
            cluster.wait_ready(timeout=30)
        except TimeoutError:
            raise AssertionError(json.dumps(
                {i: cluster.status(i) for i in range(4)}, indent=1, default=str)) from None
        for publisher in publishers:
            publisher.wait_acked(len(publisher.acked) + 800, timeout=20)
        for publisher in publishers:
            publisher.stop()
        check_everything(cluster, publishers, subscribers, set())
        cluster.wait_same_applied(range(4))
        print(f"leader {leader}; " + "; ".join(
            f"{p.summary()} {failure_reasons(p)}" for p in publishers))
