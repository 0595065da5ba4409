"""A seed SIGTERMed while it replays its Raft journal at start-up, real processes.

pysyncobj applies every committed entry of the journal in one tick of its Raft thread,
and the seed's hub takes each batch after it: a seed stopped then applied the whole
journal before it closed (2.4-4.8 s of exit after the SIGTERM with a journal of
140,000 messages, 150,000 subjects; 0.07-1.3 s now). It now closes with the rest
unapplied (cluster/raft_consumer.py ``RaftClosing``, cluster/seed.py): it must still
exit 0, say nothing went wrong (no traceback from its Raft thread), and come back whole.
Counted, not timed: the seed says how many committed entries it left unapplied (before:
none, it applied them all first).

The restarted seed applies each journal entry :data:`REPLAY_STEP` s slower
(``faulty_member.py``): the journal is 30-100 entries, which a seed replays in well under
a second, and on a loaded 2-core CI box (load 20+) the status poll that sees the replay
begin and the SIGTERM after it once came after the last entry (official CI of 887b418:
31 entries, no line). Slowed, the replay lasts 1-3 s and the poll is well inside it.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest
from cluster_fixture import LocalCluster
from cluster_load import LoadPublisher

SUBJECTS = tuple(f"/replay/s{i}" for i in range(5000))
REPLAY_STEP = 0.03
"""Seconds added to each entry the restarted seed applies (its replay, until the SIGTERM)."""


def replaying(cluster: LocalCluster, index: int) -> bool:
    """Whether the member's hub has begun to take the batches of its journal."""
    try:
        return int(cluster.status(index)["applied_clsn"]) > 0
    except OSError:  # (not listening yet)
        return False


def stopped_count(log: str) -> int:
    """The messages the member's hub had taken when it stopped (its last line)."""
    counts = re.findall(r"stopped: \d+ connections served, (\d+) messages published", log)
    assert counts, log[-2000:]
    return int(counts[-1])


@pytest.mark.slow
def test_a_seed_stopped_while_it_replays_its_journal_exits_at_once_and_whole(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path, members=3, seeds=3,
                           ClusterLogCompactionEntries="1000000")  # (all in the journal)
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=40)
        publisher = LoadPublisher([cluster.port(1)], rate=8000, duration=2.5,
                                  subjects=SUBJECTS)
        publisher.start()
        publisher.join(20)
        total = len(publisher.acked)
        assert total > 10_000, publisher.summary()
        victim = next(i for i in range(3) if i != cluster.leader())
        cluster.kill(victim, signal.SIGTERM)
        before = len(cluster.log(victim))
        cluster.faults[victim] = f"cluster.raft_consumer:CoordinationConsumer._apply~{REPLAY_STEP}"
        cluster.start(victim)
        deadline = time.monotonic() + 30
        while not replaying(cluster, victim):
            assert time.monotonic() < deadline, cluster.log(victim)[before:]
            time.sleep(0.002)  # (not at its Raft node's start: the replay begins later)
        process = cluster.processes[victim]
        assert process is not None
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        stop = cluster.log(victim)[before:]
        replayed = stopped_count(stop)
        left = re.findall(r"Raft node closed with (\d+) committed entries not applied", stop)
        assert left, f"the seed applied its whole journal before it stopped:\n{stop[-2000:]}"
        del cluster.faults[victim]  # (back at full speed)
        cluster.start(victim)
        cluster.wait_ready(timeout=30)
        batches = cluster.wait_same_applied(range(3))
        for i in range(3):
            assert "Traceback" not in cluster.log(i), cluster.log(i)[-3000:]
        print(f"{total} acknowledged in {batches} batches; the seed stopped with {left[0]} "
              f"committed Raft entries unapplied, its hub had taken {replayed} messages")
    finally:
        cluster.stop()
