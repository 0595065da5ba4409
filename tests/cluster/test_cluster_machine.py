"""The cluster state machine (``cluster_machine``) run by hypothesis.

Each example starts 3 seeds and 2 non-seeds, plays up to ``stateful_step_count``
rules (publishes, commits, deliveries, subscribers, and the faults of
``cluster_faults``), checks the invariants after every step, then heals everything
and checks that the cluster converged without loss.
"""

from __future__ import annotations

from cluster_machine import ClusterMachine
from hypothesis import HealthCheck, settings

ClusterMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_cluster_machine = ClusterMachine.TestCase
