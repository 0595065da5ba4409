"""EXPERIMENT ONLY: a cluster member whose Raft follower is pysyncobj 0.3.17's own.

``FollowerSafeSyncObj``'s override of AppendEntries is removed before any Raft node is
built, so every seed handles AppendEntries as pysyncobj does (it drops held entries on
an overlapping re-send, and logs "truncating already-applied log entries" when they were
applied). Used by ``cluster_raft_divergence.py --follower pysyncobj`` for comparison.
Run as ``python benchmarks/cluster_raft_pysyncobj_member.py serve --set ...``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.cli import main
from cluster.raft_follower import FollowerSafeSyncObj

del FollowerSafeSyncObj._SyncObj__onMessageReceived

if __name__ == "__main__":
    sys.exit(main())
