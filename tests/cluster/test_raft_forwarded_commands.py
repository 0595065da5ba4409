"""A reply to a command a seed forwarded to the leader before it restarted settles
nothing of its next life (cluster/raft_follower.py: request ids unique across restarts).

pysyncobj numbers the commands a follower forwards from 0 in every process. Seed C
forwards commands 1-3 (700 bytes, in parts), loses its disk and restarts; the leader
commits them later and answers "request 1, 2, 3: at index i" -- to the new process,
whose own first forwarded commands carry those ids: command 11 was acknowledged at the
index command 3 was applied at (CI, test_raft_safety.py with compaction, on 3698801;
the same schedule fails on ce4c267)."""

from __future__ import annotations

from test_raft_safety import Schedule

from cluster.raft_follower import FollowerSafeSyncObj

# (index, size, count, then) for submit; the schedule hypothesis shrank to
ACTIONS = [
    ("submit", 2, 700, 3, None), ("submit", 0, 4, 3, 0.05), ("lose_disk", 2),
    ("cut", 0, 0), ("submit", 0, 4, 1, 0.01), ("submit", 2, 4, 1, None), ("cut", 0, 0),
    ("submit", 0, 4, 1, 0.01), ("submit", 2, 4, 2, 0.01), ("submit", 0, 4, 1, 0.01),
    ("submit", 0, 4, 1, 0.01),
]


def test_a_reply_to_a_command_forwarded_before_a_restart_settles_nothing_else() -> None:
    schedule = Schedule(FollowerSafeSyncObj, 48, 1, compaction=True)
    try:
        for name, *args in ACTIONS:
            getattr(schedule, name)(*args)
        assert schedule.finish() == []
        applied = set(schedule.world.applied.values())
        assert any(value.startswith(b"00003:") for value in applied), "forwarded, committed"
        assert any(value.startswith(b"00011:") for value in applied)
    finally:
        schedule.world.close()
