"""How long a seed's Raft thread stops ticking while it restarts from a large dump.

A seed restarted after a log compaction loads its ``raft.dump`` on pysyncobj's Raft
thread (its first tick), as a follower sent the leader's dump does (in the tick that
receives its last part). While that thread is busy it answers no AppendEntries and no
vote; a follower whose load outlasts its election timeout (150-300 ms) stands for
election at its next tick, and a leader that needs it for its majority falls back after
``leaderFallbackTimeout`` (1.2 s) without its answers.

Here, in one process, as a seed does it: a real seed (``RaftCoordination``, a cluster of
one, its own data directory) commits ``--messages`` messages of ``--size`` bytes, each
its own content, over ``--subjects`` subjects in commands of ``--batch`` publishes,
compacts its log (a real ``raft.dump``, written by its forked writer), commits ``--tail``
more commands after the dump, and stops. Then it is started again on that directory
while the Raft thread's ticks are recorded (``_onTick`` wrapped: when each began, and
the Raft thread's CPU): reported are the longest gap between two ticks and the three
longest, the Raft thread's CPU in the longest, the dump's size, and the CPU of the
pieces of the load (``pysyncobj``'s ``deserialize``, the consumer's ``_deserialize``). The
member's GIL switch interval (0.5 ms) is set. Wall clock on the machine as it is: the
CPU figures hold on a busy box, the gaps are indicative::

    .venv/bin/python benchmarks/raft_dump_restart_ticks.py --messages 100000
    .venv/bin/python benchmarks/raft_dump_restart_ticks.py --messages 660000 --keep /tmp/dump660k
    .venv/bin/python benchmarks/raft_dump_restart_ticks.py --messages 660000 --reuse /tmp/dump660k

``--keep DIR`` keeps the data directory it built; ``--reuse DIR`` restarts from one kept
(the build of 660,000 messages takes about a minute), a copy of it each time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
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
NEVER = RaftTimings(compaction_entries=10_000_000, compaction_seconds=1e6)


def new_seed(data_dir: Path, port: int, on_commit: Any, on_restore: Any = None
             ) -> RaftCoordination:
    return RaftCoordination(
        self_address=("127.0.0.1", port), seed_addresses=[("127.0.0.1", port)],
        password="s3cret", on_commit=on_commit, on_restore=on_restore, data_dir=data_dir,
        timings=NEVER, cache_budget=256 << 20,
    )


def commands(args: argparse.Namespace, count: int, first: int) -> list[list[WireRequest]]:
    noise = os.urandom(args.size + 4096)
    out = []
    for c in range(first, first + count):
        wire: list[WireRequest] = []
        for j in range(args.batch):
            i = c * args.batch + j
            at = (i * 7919) % 4096
            content = i.to_bytes(8, "big") + noise[at:at + args.size - 8]
            wire.append(("bench#1", i, f"/bench/subject/{i % args.subjects}", content, {},
                         False, True))
        out.append(wire)
    return out


def build(args: argparse.Namespace, data_dir: Path, port: int) -> dict[str, Any]:
    raft = new_seed(data_dir, port, lambda batch: None)
    try:
        wait_for(lambda: raft.snapshot.ready, 30, "the seed's first election")
        clsn = commit_all(raft.consumer, EPOCH, commands(args, args.messages // args.batch, 0),
                          timeout=300)["clsn"]
        raft.syncobj.forceLogCompaction()
        wait_for(lambda: (data_dir / "raft.dump").exists()
                 and raft.syncobj._SyncObj__raftLog[0][1] > 1, 600, "the dump")
        clsn = commit_all(raft.consumer, EPOCH,
                          commands(args, args.tail, args.messages // args.batch),
                          timeout=300)["clsn"]
    finally:
        raft.close()
    return {"clsn": clsn}


class TickProbe:
    """When each of the Raft thread's ticks began, and that thread's CPU then."""

    def __init__(self) -> None:
        self.ticks: list[tuple[float, float]] = []
        self.loads: list[dict[str, float]] = []
        self.loaded_at = 0.0  # when the (last) dump load ended
        self.decoding: list[bool] = []  # at each tick: the dump's caches still decoding

    def install(self) -> None:
        seed_class = raft_module._SeedSyncObj
        on_tick = seed_class._onTick
        load = seed_class._SyncObj__loadDumpFile
        deserialize = raft_module.CoordinationConsumer._deserialize
        probe = self

        def ticked(node: Any, time_to_wait: float = 0.0) -> None:
            probe.ticks.append((time.monotonic(), time.thread_time()))
            cache = node._status_consumer.cache
            probe.decoding.append(bool(getattr(cache, "decoding", False)))
            on_tick(node, time_to_wait)

        def loaded(node: Any, clearJournal: bool) -> None:
            started, cpu = time.monotonic(), time.thread_time()
            load(node, clearJournal)
            probe.loaded_at = time.monotonic()
            probe.loads.append({"wall_ms": (time.monotonic() - started) * 1e3,
                                "cpu_ms": (time.thread_time() - cpu) * 1e3})

        def consumer_load(consumer: Any, data: Any) -> None:
            cpu = time.thread_time()
            deserialize(consumer, data)
            probe.loads.append({"consumer_deserialize_cpu_ms":
                                (time.thread_time() - cpu) * 1e3})

        import pysyncobj.pickle as pysyncobj_pickle

        unpickle = pysyncobj_pickle.load

        def unpickled(file: Any) -> Any:  # a dump read (messages go through loads)
            cpu = time.thread_time()
            try:
                return unpickle(file)
            finally:
                probe.loads.append({"dump_unpickle_cpu_ms": (time.thread_time() - cpu) * 1e3})

        pysyncobj_pickle.load = unpickled
        setattr(seed_class, "_onTick", ticked)  # noqa: B010 (wrapped, for this process)
        setattr(seed_class, "_SyncObj__loadDumpFile", loaded)  # noqa: B010
        setattr(raft_module.CoordinationConsumer, "_deserialize", consumer_load)  # noqa: B010

    def gaps(self) -> list[dict[str, float]]:
        pairs = itertools.pairwise(self.ticks)
        gaps = [{"gap_ms": (b[0] - a[0]) * 1e3, "raft_cpu_ms": (b[1] - a[1]) * 1e3}
                for a, b in pairs]
        return sorted(gaps, key=lambda g: -g["gap_ms"])

    def after_the_load(self) -> dict[str, Any]:
        """The gaps from the first tick after the dump's load on (links come up then)."""
        starts = [t for t, _ in self.ticks if t > self.loaded_at]
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        return {"longest_gap_after_the_load_ms": round(max(gaps, default=0.0) * 1e3, 1),
                "gaps_over_150ms_after_the_load": sum(g > 0.15 for g in gaps)}

    def decoding_figures(self) -> dict[str, Any]:
        """The ticks while the dump's caches decoded off the Raft thread (none: the code
        before, which decoded them in the load)."""
        during = [i for i, d in enumerate(self.decoding) if d]
        if not during:
            return {"ticks_while_decoding": 0}
        first, last = during[0], during[-1] + 1  # the tick that saw them decoded
        gaps = [self.ticks[i + 1][0] - self.ticks[i][0] for i in range(first, last)
                if i + 1 < len(self.ticks)]
        return {
            "ticks_while_decoding": len(during),
            "decoded_after_load_ms": round((self.ticks[min(last, len(self.ticks) - 1)][0]
                                            - self.loaded_at) * 1e3, 1),
            "longest_gap_while_decoding_ms": round(max(gaps, default=0.0) * 1e3, 1),
        }


def restart(args: argparse.Namespace, data_dir: Path, port: int, clsn: int
            ) -> dict[str, Any]:
    probe = TickProbe()
    probe.install()
    restored: list[Any] = []
    raft = new_seed(data_dir, port, lambda batch: None, restored.append)
    try:
        wait_for(lambda: raft.snapshot.clsn >= clsn and raft.snapshot.ready, 120,
                 "the restart")
        time.sleep(1.0)  # ticks after it: the usual gaps
    finally:
        raft.close()
    gaps = probe.gaps()
    return {
        "restored_syncs": len(restored),
        "clsn": raft.snapshot.clsn,
        "ticks": len(probe.ticks),
        "longest_gap_ms": round(gaps[0]["gap_ms"], 1),
        "its_raft_cpu_ms": round(gaps[0]["raft_cpu_ms"], 1),
        "next_gaps_ms": [round(g["gap_ms"], 1) for g in gaps[1:4]],
        "gaps_over_150ms": sum(g["gap_ms"] > 150 for g in gaps),
        **probe.after_the_load(),
        **probe.decoding_figures(),
        "loads": [{k: round(v, 1) for k, v in load.items()} for load in probe.loads],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--subjects", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000, help="publishes per command")
    parser.add_argument("--tail", type=int, default=20, help="commands after the dump")
    parser.add_argument("--keep", type=Path, help="keep the data directory built here")
    parser.add_argument("--reuse", type=Path, help="restart from a data directory kept")
    args = parser.parse_args()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    port = free_base_port(1)
    figures: dict[str, Any] = {"messages": args.messages, "subjects": args.subjects,
                               "size": args.size}
    scratch = tempfile.mkdtemp(prefix="raft-dump-ticks-")
    data_dir = Path(scratch) / "data"
    if args.reuse is not None:  # a copy: a restart changes its directory
        shutil.copytree(args.reuse, data_dir)
        figures["clsn"] = json.loads((data_dir / "bench.json").read_text())["clsn"]
    else:
        started = time.monotonic()
        figures.update(build(args, data_dir, port))
        figures["build_s"] = round(time.monotonic() - started, 1)
        (data_dir / "bench.json").write_text(json.dumps({"clsn": figures["clsn"]}))
    figures["dump_bytes"] = (data_dir / "raft.dump").stat().st_size
    try:
        if args.keep is not None:
            shutil.rmtree(args.keep, ignore_errors=True)
            shutil.copytree(data_dir, args.keep)
        figures.update(restart(args, data_dir, port, figures["clsn"]))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
