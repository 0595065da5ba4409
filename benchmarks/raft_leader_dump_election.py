"""Does a seed sent the leader's large dump cause an election? (docs/benchmarks.md)

Three real seeds (``RaftCoordination``, the seeds' timers: 150-300 ms election timeout)
in this process, each its own data directory. Once they elect, one follower is stopped;
the leader commits ``--messages`` 100-byte messages (each its own content, over 10,000
subjects, commands of 1,000) and compacts its log, so the stopped seed's log now ends
before the leader's begins; then that seed starts again and the leader sends it its
dump, which it loads while linked. Reported, per run: the Raft terms the seeds went
through from the restart until the restarted seed has applied the leader's last batch
(0: no election), the leaders seen meanwhile, how long the catch-up took, and the
restarted seed's longest gap between two Raft ticks after its own start-up tick.

The three Raft threads share this process's GIL (a member has one), so the figures are
those of a box busier than three separate members; compare before and after on the
same box::

    .venv/bin/python benchmarks/raft_leader_dump_election.py --messages 660000 --runs 2
    # before: cd /tmp/before && PYTHONPATH=/tmp/before <worktree>/.venv/bin/python \
    #     benchmarks/raft_leader_dump_election.py ...
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from raft_bench import commit_all, wait_for

from cluster import raft as raft_module
from cluster.node import GIL_SWITCH_INTERVAL
from cluster.raft import RaftCoordination, RaftTimings, WireRequest
from cluster.tooling import free_base_port

EPOCH = 7
TIMINGS = RaftTimings(compaction_entries=10_000_000, compaction_seconds=1e6)


def wire(command: int, batch: int, size: int, subjects: int) -> list[WireRequest]:
    out: list[WireRequest] = []
    for j in range(batch):
        i = command * batch + j
        content = i.to_bytes(8, "big") * (size // 8 + 1)
        out.append(("bench#1", i, f"/bench/subject/{i % subjects}", content[:size], {},
                    False, True))
    return out


class Ticks:
    """The restarted seed's ticks (its Raft thread's ``_onTick`` wrapped for one node)."""

    def __init__(self) -> None:
        self.watched: Any = None
        self.starts: list[float] = []
        on_tick = raft_module._SeedSyncObj._onTick
        ticks = self

        def ticked(node: Any, time_to_wait: float = 0.0) -> None:
            if node is ticks.watched:
                ticks.starts.append(time.monotonic())
            on_tick(node, time_to_wait)

        setattr(raft_module._SeedSyncObj, "_onTick", ticked)  # noqa: B010
        self.candidacies: list[str] = []  # (who stood, since the restart)
        set_state = raft_module._SeedSyncObj._SyncObj__setState

        def stood(node: Any, state: int) -> None:
            if state == 1 and ticks.watched is not None:  # _RAFT_STATE.CANDIDATE
                ticks.candidacies.append("restarted" if node is ticks.watched else "other")
            set_state(node, state)

        setattr(raft_module._SeedSyncObj, "_SyncObj__setState", stood)  # noqa: B010

    def longest_after_start(self) -> float:
        gaps = [b - a for a, b in zip(self.starts[1:], self.starts[2:], strict=False)]
        return max(gaps, default=0.0)


def run(args: argparse.Namespace, root: Path, ticks: Ticks) -> dict[str, Any]:
    base = free_base_port(3)
    addresses = [("127.0.0.1", base + 10 * i) for i in range(3)]
    nodes: dict[int, RaftCoordination] = {}

    def start(i: int) -> RaftCoordination:
        nodes[i] = RaftCoordination(
            self_address=addresses[i], seed_addresses=addresses, password="s3cret",
            on_commit=lambda batch: None, on_restore=lambda sync: None,
            data_dir=root / f"seed-{i}", timings=TIMINGS, cache_budget=256 << 20,
        )
        return nodes[i]

    for i in range(3):
        start(i)
    try:
        def leader() -> int | None:
            states = {i: n.snapshot.state for i, n in nodes.items()}
            return next((i for i, s in states.items() if s == "leader"), None)

        # every seed taking part before one is stopped: a seed started on an empty
        # ClusterDataDir waits for 2 of the 2 others' terms once the leader wrote an entry
        # (cluster/raft_term_query.py); the one stopped right after an election could be
        # the one it had not heard yet -- it then waited for ever, nothing committed, and
        # the commit phase stalled (docs/benchmarks.md)
        wait_for(lambda: leader() is not None
                 and all(n.snapshot.ready for n in nodes.values()), 30, "a leader")
        first = leader()
        assert first is not None
        stopped = next(i for i in range(3) if i != first)
        nodes.pop(stopped).close()
        commands = args.messages // args.batch
        # (the three Raft threads share one GIL: the leader may change meanwhile, a
        # command in flight then fails and is submitted again, raft_bench.py)
        committed = commit_all(lambda: nodes[leader() or first].consumer, EPOCH, [
            wire(c, args.batch, args.size, args.subjects) for c in range(commands)])
        wait_for(lambda: (leading := leader()) is not None
                 and nodes[leading].snapshot.clsn >= committed["clsn"], 60, "the leader")
        first = leader()  # (the one whose log is compacted: it sends the dump)
        assert first is not None
        clsn = nodes[first].snapshot.clsn
        syncobj = nodes[first].syncobj
        applied = syncobj._SyncObj__raftLastApplied
        syncobj.forceLogCompaction()
        # this compaction's dump, not an earlier one (ClusterLogCompactionBytes compacts
        # in the commit phase already): restarted before it is written, the seed waited
        # for it ("serialized: None"), ~15 s of a nice-19 writer on a busy box
        wait_for(lambda: syncobj._SyncObj__raftLog[0][1] >= applied - 1, 600,
                 "the leader's compaction")
        term = max(n.snapshot.term for n in nodes.values())
        started = time.monotonic()
        restarted = start(stopped)
        ticks.watched, ticks.starts, ticks.candidacies = restarted.syncobj, [], []
        terms: set[int] = set()
        leaders: set[str] = set()

        def caught_up() -> bool:
            for n in nodes.values():
                terms.add(n.snapshot.term)
                if n.snapshot.leader is not None:
                    leaders.add(n.snapshot.leader)
            return restarted.snapshot.clsn >= clsn and restarted.snapshot.ready

        wait_for(caught_up, 120, "the restarted seed's catch-up")
        took = time.monotonic() - started
        time.sleep(1.0)  # an election the load caused may come just after
        caught_up()
        return {
            "elections": max(terms) - term,
            "leaders_seen": len(leaders),
            "candidacies": sorted(ticks.candidacies),
            "catch_up_s": round(took, 2),
            "restarted_longest_tick_gap_ms": round(ticks.longest_after_start() * 1e3, 1),
            "dump_bytes": (root / f"seed-{first}" / "raft.dump").stat().st_size,
            "commands_submitted_again": committed["submitted_again"],
        }
    finally:
        for n in nodes.values():
            n.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--subjects", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000, help="publishes per command")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    ticks = Ticks()
    for _ in range(args.runs):
        root = Path(tempfile.mkdtemp(prefix="raft-leader-dump-"))
        try:
            print(json.dumps({"messages": args.messages, **run(args, root, ticks)}))
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
