"""A non-seed whose every link to the seeds is refused, real processes.

Every seed's cluster-link port refuses it (connections reset, new ones refused) for
4 s under a publisher at 1,000/s, Raft between the seeds untouched: the non-seed is
cut off. Nothing may be acknowledged meanwhile that is then lost; once the ports
open, what it held goes through and every acknowledged publish reaches a subscriber
on the seeds, in order, once. What a run saw: 0 acknowledged while cut off, the
publisher sent away after 3 s (close 1013, "member cut off from the cluster": its
~1,300-1,700 publishes in flight unanswered, an unknown outcome), those forwarded
again once the links came back, no failure.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from cluster_fixture import LocalCluster
from cluster_load import LoadPublisher, LoadSubscriber
from gated_seeds import started_behind_gates
from test_cluster_fault_combinations import CACHE, check_everything, failure_reasons

SEEDS = [0, 1, 2]
NON_SEED = 3


@pytest.mark.slow
def test_a_non_seed_whose_every_seed_link_is_refused(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=4, seeds=3, MaxCachedMessagesPerSubject=CACHE)
    with started_behind_gates(cluster) as gates:
        watcher = LoadSubscriber([cluster.port(i) for i in SEEDS], tag="watcher", duration=60)
        watcher.start()
        watcher.wait_subscribed(10)
        publisher = LoadPublisher([cluster.port(NON_SEED)], rate=1000, duration=40)
        publisher.start()
        publisher.wait_acked(1000, timeout=15)
        for i in SEEDS:
            gates[i][0].close_gate(reset_open=True)
        cut_at = len(publisher.acked)
        time.sleep(4)
        during = len(publisher.acked) - cut_at
        for i in SEEDS:
            gates[i][0].open_gate()
        cluster.wait_ready(timeout=30)
        publisher.wait_acked(len(publisher.acked) + 1000, timeout=20)
        publisher.stop()
        check_everything(cluster, [publisher], [watcher], set())
        print(f"acknowledged while cut off {during}; {publisher.summary()} "
              f"{failure_reasons(publisher)}; refused {[gates[i][0].refused for i in SEEDS]}")
