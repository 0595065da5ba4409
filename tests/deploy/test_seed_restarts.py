"""Seed pods recreated with new IPs link up again in seconds (tests/deploy/seed_restarts.py).

Before cluster/raft_transport.py, the seeds that dial a recreated seed waited on a SYN
to its old IP: 38.8 s without a link after the second seed was recreated, and no link
within 40 s after the third (Raft leaderless meanwhile, as in the rehearsal).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from namespaced import run_namespaced

LINK_LIMIT = 12.0
"""Seconds from a seed pod's recreation until every seed links to every other one: the
new pod's start-up plus a dial abandoned after 1 s and a new lookup (1.3-1.5 s measured
alone on the machine)."""


@pytest.mark.slow
def test_recreated_seed_pods_link_up_again_in_seconds(tmp_path: Path) -> None:
    _, summary = run_namespaced("seed_restarts.py", tmp_path, cpu_limit=60)
    log = "\n".join(summary["events"])
    assert summary["violations"] == [], log
    restarts = summary["restarts"]
    assert [r["pod"] for r in restarts] == [
        "first start", "migratory-2", "migratory-1", "migratory-0"
    ], log
    for restart in restarts[1:]:
        linked = restart["linked_seconds"]
        assert linked is not None and linked <= LINK_LIMIT, (restart, log)
        assert restart["then_ready_seconds"] is not None, (restart, log)
        assert restart["ip"] != restart["old_ip"]  # the pod came back at a new IP
