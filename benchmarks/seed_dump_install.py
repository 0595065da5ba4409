"""How long a seed's event loop stops while it takes a Raft dump (issue 13, "no stalls").

In this process, as a seed does it: a replicated cache of ``--messages`` messages of
``--size`` bytes over ``--subjects`` subjects (``CacheMemoryBudget`` default 256 MiB) is
written as a seed writes a dump (``raft_dump_files.write_dump``: gzip, pickle protocol
2 before ``DUMP_PROTOCOL``, 4 since); then, while a trio task
ticks every millisecond and records the gaps between its ticks, a thread plays the Raft
thread -- it loads the dump (``raft_unpickler``, as pysyncobj's ``deserialize``), makes
the cache sync of it (``ReplicatedCache.to_sync``: copies; the seed builds the records
as it installs them) and hands it to the seed's trio
thread (``run_sync_soon`` of ``SeedCoordination._restored``) -- and the seed installs it
into its hub. Reported: the loop's longest gap and its gaps over 50 ms, while the Raft
thread works and while the seed installs (GIL switch interval 0.5 ms, as a member
runs); the CPU time of each step and of each slice of
the install (thread time: it holds on a busy machine); the garbage collections of each
phase (``gc.callbacks``). The gaps are wall clock on the machine as it is: take them as
indicative on a busy one::

    .venv/bin/python benchmarks/seed_dump_install.py --messages 660000 --subjects 10000
    .venv/bin/python benchmarks/seed_dump_install.py --messages 660000 --subjects 10000 \
        --distinct-contents   # as a real load's dump: every content its own bytes
    # the code before: PYTHONPATH=/tmp/before .venv/bin/python benchmarks/seed_dump_install.py ...
"""

from __future__ import annotations

import argparse
import gc
import gzip
import io
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import trio

from cluster import raft_dump_files, raft_unpickler
from cluster.coordination import UNNUMBERED_EPOCH
from cluster.forwarding import Outgoing
from cluster.node import GIL_SWITCH_INTERVAL
from cluster.publishing import ClusterPublishing
from cluster.replica import Replica
from cluster.replicated_cache import ReplicatedCache
from cluster.seed import SeedCoordination
from cluster.stream import CommittedStream
from cluster.tooling import free_base_port, member_settings
from migratory.config import load_config
from migratory.model.message import Message, Qos
from migratory.server.hub import Hub

BUDGET = 256 << 20
TICK = 0.001


def dump_of(args: argparse.Namespace) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """The replicated cache as pysyncobj writes it, and every subject's position."""
    cache = ReplicatedCache(1000, BUDGET)
    subjects = [f"/bench/subject/{i}" for i in range(args.subjects)]
    content = os.urandom(args.size)
    noise = os.urandom(args.size + 4096)
    seqs = [0] * args.subjects
    for i in range(args.messages):
        s = i % args.subjects
        seqs[s] += 1
        if args.distinct_contents:  # each its own bytes, as a real load's (no pickle memo)
            at = (i * 7919) % 4096
            content = i.to_bytes(8, "big") + noise[at:at + args.size - 8]
        cache.append([Message(subjects[s], content, {}, False, Qos.GUARANTEED, None, 7,
                              seqs[s])])
    with tempfile.TemporaryDirectory() as directory:  # written as a seed writes its dump
        path = os.path.join(directory, "raft.dump")
        assert raft_dump_files.write_dump(path, cache) == 0
        with open(path, "rb") as f:
            written = f.read()
    return written, {s: (7, seqs[i]) for i, s in enumerate(subjects)}


def new_seed(data_dir: Path) -> SeedCoordination:
    settings = member_settings(0, members=4, seeds=3, mode="Guaranteed",
                               base_port=free_base_port(4), password="s3cret",
                               data_dir=data_dir)
    config = load_config(overrides=settings, environ={})
    replica = Replica(Hub(epoch=UNNUMBERED_EPOCH, numbered_elsewhere=True,
                          cache_memory_budget=BUDGET))
    stream = CommittedStream(ClusterPublishing(origin="me#1", replica=replica))
    return SeedCoordination(config=config, name="127.0.0.1:1", stream=stream,
                            outgoing=Outgoing(stream.publishing))


def gaps_figures(gaps: list[float]) -> dict[str, object]:
    return {"longest_ms": round(max(gaps, default=0.0) * 1e3, 1),
            "over_50ms": sum(g > 0.05 for g in gaps), "ticks": len(gaps)}


class Collections:
    """Every garbage collection's wall time, by generation and by phase (gc.callbacks)."""

    def __init__(self, phase: list[str]) -> None:
        self.phase = phase
        self.seen: dict[str, dict[int, list[float]]] = {}
        self._started = 0.0

    def __call__(self, stage: str, info: dict[str, int]) -> None:
        if stage == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        by_generation = self.seen.setdefault(self.phase[0], {})
        by_generation.setdefault(info["generation"], []).append(took)

    def figures(self) -> dict[str, object]:
        return {phase: {f"gen{g}": {"count": len(t), "longest_ms": round(max(t) * 1e3, 1)}
                        for g, t in sorted(by_generation.items())}
                for phase, by_generation in self.seen.items()}


async def take_dump(dump: bytes, positions: dict[str, tuple[int, int]],
                    seed: SeedCoordination) -> dict[str, object]:
    token = trio.lowlevel.current_trio_token()
    replica = seed.stream.replica
    clsn = 10
    phase = ["raft"]
    gaps: dict[str, list[float]] = {"raft": [], "install": []}
    cpu: dict[str, float] = {}
    handed = trio.Event()
    collections = Collections(phase)
    gc.callbacks.append(collections)
    slices: list[float] = []  # CPU time of each slice of the install
    install_slice = replica.install_slice

    def timed_slice(*args: Any, **kwargs: Any) -> bool:
        started = time.thread_time()
        try:
            return install_slice(*args, **kwargs)
        finally:
            slices.append(time.thread_time() - started)

    replica.install_slice = timed_slice  # type: ignore[method-assign]

    def raft_thread() -> None:
        started = time.thread_time()
        with gzip.GzipFile(fileobj=io.BytesIO(dump)) as g:
            cache = raft_unpickler.load(g)
        cpu["raft_load_ms"] = (time.thread_time() - started) * 1e3
        started = time.thread_time()
        sync = cache.to_sync(clsn, positions)
        cpu["raft_to_sync_ms"] = (time.thread_time() - started) * 1e3

        def hand_over() -> None:
            phase[0] = "install"
            started = time.thread_time()
            seed._restored(sync)
            cpu["restored_callback_ms"] = (time.thread_time() - started) * 1e3
            handed.set()

        token.run_sync_soon(hand_over)

    async with trio.open_nursery() as nursery:
        seed._nursery = nursery
        thread = threading.Thread(target=raft_thread)
        last = time.perf_counter()
        thread.start()
        begun = time.perf_counter()
        for _ in range(1_000_000):
            await trio.sleep(TICK)
            now = time.perf_counter()
            gaps[phase[0]].append(now - last - TICK)
            last = now
            if handed.is_set() and replica.installing is None \
                    and replica.applied_clsn == clsn:
                break
        took = time.perf_counter() - begun
        thread.join()
        nursery.cancel_scope.cancel()
    gc.callbacks.remove(collections)
    return {"collections": collections.figures(),
            "seconds": round(took, 2), "cpu": {k: round(v, 1) for k, v in cpu.items()},
            "while_raft_thread_works": gaps_figures(gaps["raft"]),
            "while_seed_installs": gaps_figures(gaps["install"]),
            "install_slices": {"count": len(slices),
                               "longest_cpu_ms": round(max(slices, default=0) * 1e3, 1),
                               "cpu_ms": round(sum(slices) * 1e3, 1)},
            "installed_subjects": len(replica.hub.subject_names())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=660_000)
    parser.add_argument("--subjects", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--distinct-contents", action="store_true",
                        help="each message its own content (else one bytes object shared "
                             "by all: pickle writes it once, and the dump is ~1/4 the size)")
    args = parser.parse_args()
    dump, positions = dump_of(args)
    with tempfile.TemporaryDirectory() as data_dir:
        seed = new_seed(Path(data_dir))
        gc.collect()
        gc.freeze()  # as the server does after start-up, with its thresholds
        gc.set_threshold(20_000, 2, 200)
        sys.setswitchinterval(GIL_SWITCH_INTERVAL)  # as a member runs (cluster/node.py)
        result = trio.run(take_dump, dump, positions, seed)
    result["dump_bytes"] = len(dump)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
