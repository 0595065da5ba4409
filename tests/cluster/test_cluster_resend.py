"""A non-seed that loses its seed forwards its unanswered publishes again, through the
next one (real member processes).

What a non-seed had forwarded to its upstream seed and got no answer for when it left
that seed -- the link cut (:meth:`TcpGate.hold`, both ways, until the non-seed moved
on), or the seed SIGSTOPped -- goes to the next seed again, oldest first, ahead of the
newer publishes (``ClusterPublishing.resend_unanswered``). Lost with the seed it left,
it commits now; committed already through that seed, the coordinator answers the copy
with the first copy's position (``CommittedBatch.repeats``). Before, all of them ended
"outcome unknown" after the 10 s publish timeout: 1,991 of 5,772 publishes at 1,000/s
(``test_a_non_seeds_forwards_delivered_late_after_it_moved_on``, which this extends).

Each test checks: every publish answered exactly once, with ``PUBLISH_OK`` or a
failure; every acknowledged one delivered to every subscriber once, in order, at its
position, none numbered twice (:func:`check_everything`); "outcome unknown" only for what
the fault or a Raft election may have left so (:func:`check_unknown_outcomes`). Counts, no
time asserted.

With only the seed's direction held, the copies of the publishes that committed through
the seed the non-seed left must come back as repeats -- those that reach the coordinator:
in the CI of 0dfa9a5f the Raft leader changed as the copies went through the next seed
(2,019 sent again, 0 repeats; 40 newer publishes of the same commands failed "the Raft
leader changed"): the seed refused the copies for sure, and the first copies' batches
answered the publishes. Reproduced by stopping the Raft leader for 1.2 s as the non-seed
switched: 1,996 sent again, 1,996 of them refused, 0 repeats, 337 newer publishes failed
"the Raft leader changed". So the test counts, from the watcher's side, the publishes sent
after the hold that were numbered before the non-seed linked to the next seed (their
copies went out after their first copies were numbered), and requires each to come back
as a repeat or be refused by the seed (``copies_refused``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cluster_fixture import LocalCluster
from cluster_load import LoadPublisher, LoadSubscriber
from gated_seeds import behind_gates
from tcp_gate import TcpGate
from test_cluster_fault_combinations import (
    CACHE,
    NON_SEED,
    SEEDS,
    check_everything,
    failure_reasons,
    upstream_of,
)

from cluster.coordination import RECENT_PER_ORIGIN
from cluster.publishing import OVERTAKEN
from migratory.model.message import MessageType

RESEND_AGE = 4.5
"""Seconds from the hold to the switch within which every publish sent after the hold
goes again (``resend_unanswered``: those younger than half the 10 s publish timeout)."""


def answered_once(publisher: LoadPublisher) -> None:
    """Every publish sent got exactly one answer."""
    assert publisher.unanswered == set(), publisher.summary()
    missing = set(publisher.sent) - set(publisher.answers)
    assert missing == set(), f"{len(missing)} never answered: {sorted(missing)[:5]}"
    again = {closure: n for closure, n in publisher.answers.items() if n != 1}
    assert again == {}, f"{len(again)} answered more than once: {list(again.items())[:5]}"


def raft_terms(cluster: LocalCluster, seeds: list[int]) -> list[int]:
    """The Raft term of each of ``seeds`` (an election moves those of all but a seed cut
    off, and the seed the non-seed leaves is not asked: it may be SIGSTOPped)."""
    return [int(cluster.status(i).get("raft_term") or 0) for i in seeds]


@dataclass(frozen=True)
class Fault:
    """What a run's fault could leave unknown: ``window``, the publishes unanswered at the
    hold or sent between the hold and the switch; and the seeds' Raft terms at the start,
    at the switch and at the end (:func:`raft_terms`)."""

    window: set[str]
    terms: tuple[list[int], list[int], list[int]]


def check_unknown_outcomes(publisher: LoadPublisher, fault: Fault) -> None:
    """A publish's outcome is unknown only when the fault hit its forward, or a Raft
    election did (the publishes in flight at a leader change: "the Raft leader changed"
    at the seed, which may still commit them). So none without an election, and none
    outside the fault's window unless an election came after the switch. Here: 0 in 11
    runs of the three tests (two with an election); 64 in one where the seeds elected
    twice during the hold (load 25); 1,227, all in the window, with the Raft leader
    SIGSTOPped 1.2 s at the hold. The bound was 50 unknown in any run: a seed planted to
    drop one forward in 1,000 silently left 6 and 8 and passed (one in 100: 62, 122)."""
    unknown = {c for c, reason in publisher.failed.items() if "outcome unknown" in reason}
    start, switch, end = fault.terms
    said = f"{len(unknown)} outcomes unknown, Raft terms {start} -> {switch} -> {end}"
    if start == end:
        assert unknown == set(), f"{said}: no election, no fault left them unknown"
    if switch == end:
        order = {closure: i for i, closure in enumerate(publisher.sent)}
        outside = sorted(order[c] for c in unknown - fault.window)
        assert outside == [], f"{said}; outside the fault's window: the {outside[:5]}th sent"


def leave_upstream(
    cluster: LocalCluster, upstream: int, on_it: float, timeout: float = 10
) -> float:
    """Until the non-seed replicates from another seed; when it was last seen on
    ``upstream`` (the time before the look that found it there, or ``on_it``: it had
    forwarded nothing again yet)."""
    deadline = time.monotonic() + timeout
    last_seen = on_it
    while True:
        before = time.monotonic()
        if upstream_of(cluster, NON_SEED) != upstream:
            return last_seen
        last_seen = before
        assert time.monotonic() < deadline, "the non-seed did not leave its seed"
        time.sleep(0.05)


@dataclass(frozen=True)
class Copies:
    """What the copies of a run must show: ``numbered_first`` of the publishes sent after
    the hold were numbered before the non-seed left its seed, so that many copies at least
    are repeats or refused (``counted``: whether each of them surely went again, else
    ``why`` not)."""

    numbered_first: int
    counted: bool
    why: str


def copies_of_numbered(
    publisher: LoadPublisher, watcher: LoadSubscriber, sent_at_hold: int, sent_at_switch: int,
    held: float, last_seen: float, switched: float,
) -> Copies:
    """The publishes sent after the hold that ``watcher`` (on another seed) received
    before the non-seed was last seen on its seed: numbered then, they were not answered
    (their batches reached the non-seed only through the next seed, after the switch),
    so they went again after their first copy was numbered -- provided the switch came
    within :data:`RESEND_AGE` of the hold and no more than the coordinator's window of
    the origin's publishes (:data:`RECENT_PER_ORIGIN`) were sent meanwhile."""
    early = {m.content for m in watcher.messages(until=last_seen)
             if m.type is not MessageType.SNAPSHOT}
    after_hold = list(publisher.sent.values())[sent_at_hold:]
    numbered_first = sum(content in early for _, content in after_hold)
    if switched - held >= RESEND_AGE:
        return Copies(numbered_first, False, f"switched {switched - held:.1f} s after the hold")
    if sent_at_switch - sent_at_hold > RECENT_PER_ORIGIN:
        return Copies(numbered_first, False, f"{sent_at_switch - sent_at_hold} sent meanwhile")
    return Copies(numbered_first, True, "")


def stop_the_leader(cluster: LocalCluster, seconds: float = 1.2) -> threading.Thread:
    """SIGSTOP the Raft leader for ``seconds`` (in a thread of its own, started)."""
    process = cluster.processes[cluster.leader()]
    assert process is not None

    def pause() -> None:
        process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            process.send_signal(signal.SIGCONT)

    thread = threading.Thread(target=pause, daemon=True)
    thread.start()
    return thread


def run(
    cluster: LocalCluster, gates: dict[int, list[TcpGate]] | None = None, *,
    back_only: bool = False, leader_stopped: bool = False,
) -> tuple[dict[str, int], Copies]:
    """Publishes at 1,000/s through the non-seed; its upstream seed cut off (its link
    held at its ``gates``, both ways or ``back_only``; without gates, the seed
    SIGSTOPped) until the non-seed leaves it and 500 more are acknowledged through the
    next seed, then back (``leader_stopped``: the Raft leader SIGSTOPped 1.2 s at the
    hold too). Returns the non-seed's publishing statistics and what its copies must
    show (:func:`copies_of_numbered`)."""
    cluster.start_all()
    cluster.wait_ready(timeout=40)
    upstream = upstream_of(cluster, NON_SEED)
    watcher = LoadSubscriber([cluster.port(i) for i in SEEDS if i != upstream], tag="watcher",
                             duration=60)
    local = LoadSubscriber([cluster.port(NON_SEED)], tag="local", duration=60)
    for subscriber in (watcher, local):
        subscriber.start()
        subscriber.wait_subscribed(10)
    publisher = LoadPublisher([cluster.port(NON_SEED)], rate=1000, duration=40)
    publisher.start()
    publisher.wait_acked(2000, timeout=15)
    process = cluster.processes[upstream]
    assert process is not None
    others = [i for i in SEEDS if i != upstream]
    terms = raft_terms(cluster, others)
    held = time.monotonic()
    if gates is not None:
        (gates[upstream][0].hold_back if back_only else gates[upstream][0].hold)()
    else:
        process.send_signal(signal.SIGSTOP)
    sent_at_hold = len(publisher.sent)  # (after: none of those after it got through)
    in_flight = publisher.outstanding()
    pause = stop_the_leader(cluster) if leader_stopped else None
    try:
        last_seen = leave_upstream(cluster, upstream, held)
        switched, sent_at_switch = time.monotonic(), len(publisher.sent)
        terms_at_switch = raft_terms(cluster, others)
        publisher.wait_acked(len(publisher.acked) + 500, timeout=15)
    finally:
        if gates is not None:
            gates[upstream][0].release()
        else:
            process.send_signal(signal.SIGCONT)
    if pause is not None:
        pause.join()
    publisher.wait_acked(len(publisher.acked) + 500, timeout=15)
    publisher.stop()
    check_everything(cluster, [publisher], [watcher, local], set())
    answered_once(publisher)
    stats = cluster.status(NON_SEED)["publishing"]  # (the copies' answers came meanwhile)
    copies = copies_of_numbered(publisher, watcher, sent_at_hold, sent_at_switch, held,
                                last_seen, switched)
    cut = "seed stopped" if gates is None else "link held" + " back" * back_only
    print(f"{cut}: {publisher.summary()}; failures {failure_reasons(publisher)}; "
          f"non-seed resent {stats.get('resent')}, repeats {stats.get('repeats')} "
          f"(answered so {stats.get('acknowledged_repeats')}), copies refused "
          f"{stats.get('copies_refused')}, overtaken {stats.get('overtaken')}; "
          f"{copies.numbered_first} sent after the hold were numbered before the switch "
          f"({copies.why or 'each went again'})")
    overtaken = sum(reason.endswith(OVERTAKEN) for reason in publisher.failed.values())
    assert overtaken == stats["overtaken"], (overtaken, stats)  # each told its client once
    window = in_flight | set(list(publisher.sent)[sent_at_hold:sent_at_switch])
    check_unknown_outcomes(
        publisher, Fault(window, (terms, terms_at_switch, raft_terms(cluster, others))))
    return stats, copies


@contextlib.contextmanager
def four_members(tmp_path: Path, *, gated: bool) -> Iterator[
    tuple[LocalCluster, dict[int, list[TcpGate]] | None]
]:
    """3 seeds and a non-seed (``gated``: each seed's links behind a :class:`TcpGate`)."""
    cluster = LocalCluster(tmp_path, members=4, seeds=3, MaxCachedMessagesPerSubject=CACHE)
    gates = behind_gates(cluster) if gated else None
    try:
        yield cluster, gates
    finally:
        cluster.stop()
        for pair in (gates or {}).values():
            for gate in pair:
                gate.shutdown()


@pytest.mark.slow
def test_a_non_seed_cut_from_its_seed_forwards_its_unanswered_publishes_again(
    tmp_path: Path,
) -> None:
    """The link held both ways until the non-seed left (2 s of silence), then delivered
    late to the seed, alive all along: the first copies reach it after the copies went
    through the next seed (dropped, or answered as repeats)."""
    with four_members(tmp_path, gated=True) as (cluster, gates):
        run(cluster, gates)


@pytest.mark.slow
def test_copies_of_publishes_that_committed_are_recognised(tmp_path: Path) -> None:
    """Only what the seed sends back is held: the non-seed's forwards reach the seed and
    commit, their batches do not reach the non-seed, which leaves after 2 s and forwards
    them again; the coordinator finds them numbered (repeats, carried to the non-seed in
    the batch) and numbers none twice. A copy the next seed refused (a leader change
    while it went through) is not numbered and no repeat: the first copy's batch answers
    its publish."""
    with four_members(tmp_path, gated=True) as (cluster, gates):
        stats, copies = run(cluster, gates, back_only=True)
        assert stats["resent"] > 0, stats
        if copies.counted:  # each of those copies a repeat, or refused before Raft took it
            assert stats["repeats"] + stats["copies_refused"] >= copies.numbered_first, (
                stats, copies)


@pytest.mark.slow
def test_a_non_seeds_seed_stopped_its_unanswered_publishes_go_again(tmp_path: Path) -> None:
    """The upstream seed SIGSTOPped (sometimes the Raft leader: an election meanwhile)
    until the non-seed left it and published through the next one, then continued."""
    with four_members(tmp_path, gated=False) as (cluster, _):
        run(cluster)


@pytest.mark.slow
def test_forwards_lost_at_a_leader_change_fail_for_sure(tmp_path: Path) -> None:
    """As above, the Raft leader SIGSTOPped 1.2 s at the hold too: forwards the leader
    change lost while newer ones of the non-seed committed, whose copies reach the
    coordinator after those and are dropped (the per-origin order): never numbered, never
    to be. The batch names them (``CommittedBatch.overtaken``) and each fails at once
    (``PUBLISH_FAILED``, "not published: newer publishes ... (publish again)"); the
    checker finds none of them delivered. Before, they ended "outcome unknown" after the
    10 s publish timeout: 1,008 and 255 in two of five runs here (0 in the others: the
    leader change lost none; this test then passes either way), 191 and 1,227 in h163's
    runs; with the rule taken out this test failed 'assert 255 == 0'. Now: 231, 315 and
    624 failed for sure in three runs, 0 unknown (~20-35 s a run, load ~15)."""
    with four_members(tmp_path, gated=True) as (cluster, gates):
        stats, _ = run(cluster, gates, back_only=True, leader_stopped=True)
        assert stats["unknown_outcome"] == 0, stats
