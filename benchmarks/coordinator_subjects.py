"""What every subject ever published costs the seeds: memory, Raft dump, catch-up.

The seeds' replicated state (``cluster/raft.py`` ``CoordinationConsumer``: the
:class:`~cluster.coordination.Coordinator` and the replicated caches) keeps one seq per
subject for ever (``Coordinator.seqs``), and each retained subject's snapshot for ever
(``ReplicatedCache``; its cached messages are bounded by ``CacheMemoryBudget``). An IoT
user with one subject per device sees both grow with every device that ever published.

This fills one consumer the way Raft does (``commit_batch`` of batches of
``--batch`` messages, one message per subject, ``--size`` bytes of content), then
measures, each step in this process's CPU time (the box may be busy):

- ``memory``: resident bytes per subject the state holds -- the numbering alone (a bare
  ``Coordinator``) and the whole replicated state (numbering and caches);
- ``dump``: the compaction dump of the consumer (its ``_serialize()``, written as a seed
  writes ``raft.dump``: ``cluster.raft_dump_files.write_dump``, gzip, pickle protocol 2
  before ``DUMP_PROTOCOL``, 4 since; ``--step numbering``: the numbering alone, protocol 2):
  bytes, and the CPU of pickle + gzip (done in a forked child by the seed: the whole
  state is pickled at each compaction);
- ``catch_up``: what a seed that lost its disk runs once the leader's dump arrived:
  gunzip + unpickle (``cluster.raft_unpickler``), ``_deserialize`` (which copies the
  numbering and the packed caches), and the install of that sync into its hub (which
  builds each subject's record, its messages unpacked, as it reads it);
- ``digest``: the coordinator's fingerprint the Raft thread computes (spaced out to
  1 % of its time, ``cluster/raft.py`` ``DIGEST_SHARE``; since h91 it reads no subject);
- ``number_known_us`` (``--step numbering``): the CPU of numbering a message of a known
  subject (as many messages again, over 10,000 of the subjects).

One step per run (``--step``; each well under 60 s of CPU at 1,000,000 subjects)::

    B=benchmarks/coordinator_subjects.py D=/tmp/coordinator.dump
    .venv/bin/python $B --subjects 1000000 --step numbering
    .venv/bin/python $B --subjects 1000000 --step state --dump-file $D
    .venv/bin/python $B --subjects 1000000 --step catch-up --dump-file $D
    (add --retained to each: every subject keeps a snapshot; --install-limit N to
    install only N subjects of the dump at catch-up, when the whole is past 60 s)
"""

from __future__ import annotations

import argparse
import gc
import gzip
import io
import json
import os
import tempfile
import time
from typing import Any

from pysyncobj import pickle as pysyncobj_pickle

from cluster import raft_dump_files, raft_unpickler
from cluster.cache_sync import CacheSync, install_sync
from cluster.coordination import UNNUMBERED_EPOCH, Coordinator
from cluster.raft import CoordinationConsumer, WireRequest
from migratory.server.hub import Hub

BUDGET = 256 << 20  # CacheMemoryBudget's default
EPOCH = 7


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def batches(args: argparse.Namespace) -> Any:
    """Wire batches of one message per subject, fresh strings (as unpickled from Raft)."""
    content = b"x" * args.size
    for start in range(0, args.subjects, args.batch):
        end = min(args.subjects, start + args.batch)
        yield [("seed-0", i, f"/devices/{device_id(i)}/telemetry", content, {"t": "1"},
                args.retained, True) for i in range(start, end)]


def device_id(i: int) -> str:
    """16 hex digits that look random (as compressible as a device's serial number)."""
    return f"{i * 0x9E3779B97F4A7C15 % (1 << 64):016x}"


def fill_coordinator(args: argparse.Namespace) -> tuple[Coordinator, float]:
    coordinator = Coordinator()
    started = time.process_time()
    for wire in batches(args):
        coordinator.apply_wire(EPOCH, wire)
    return coordinator, time.process_time() - started


def fill_consumer(args: argparse.Namespace) -> tuple[CoordinationConsumer, float]:
    consumer = CoordinationConsumer(lambda batch: None, None, 1000, BUDGET)
    started = time.process_time()
    for wire in batches(args):
        w: list[WireRequest] = wire
        consumer.commit_batch(EPOCH, w, _doApply=True)
    return consumer, time.process_time() - started


def per_subject(grown: int, subjects: int) -> float:
    return round(grown / subjects, 1)


def numbering(args: argparse.Namespace) -> dict[str, Any]:
    """The numbering alone (a bare Coordinator): memory, digest, its share of a dump."""
    gc.collect()
    before = rss()
    coordinator, cpu = fill_coordinator(args)
    gc.collect()
    out: dict[str, Any] = {
        "bytes_per_subject": per_subject(rss() - before, args.subjects),
        "fill_cpu_s": round(cpu, 2),
    }
    started = time.process_time()
    coordinator.digest()
    out["digest_cpu_s"] = round(time.process_time() - started, 3)
    started = time.process_time()
    packed = gzip.compress(pysyncobj_pickle.dumps(coordinator.to_state()))
    out["dump_cpu_s"] = round(time.process_time() - started, 2)
    out["dump_bytes"] = len(packed)
    out["dump_bytes_per_subject"] = per_subject(len(packed), args.subjects)
    known = [[(origin, args.subjects + ref, f"/devices/{device_id(ref % 10_000)}/telemetry",
               content, fields, retained, g) for origin, ref, _, content, fields, retained, g
              in wire] for wire in batches(args)]  # as many messages, 10,000 known subjects
    started = time.process_time()
    for wire in known:
        coordinator.apply_wire(EPOCH, wire)
    out["number_known_us"] = round((time.process_time() - started) / args.subjects * 1e6, 2)
    return out


def state(args: argparse.Namespace) -> dict[str, Any]:
    """The whole replicated state: memory, and the dump pysyncobj writes of it."""
    gc.collect()
    before = rss()
    consumer, cpu = fill_consumer(args)
    gc.collect()
    out: dict[str, Any] = {
        "bytes_per_subject": per_subject(rss() - before, args.subjects),
        "fill_cpu_s": round(cpu, 2),
    }
    started = time.process_time()
    with tempfile.TemporaryDirectory() as directory:  # written as a seed writes its dump
        path = os.path.join(directory, "raft.dump")
        assert raft_dump_files.write_dump(path, consumer._serialize()) == 0
        with open(path, "rb") as f:
            dump = f.read()
    out["dump_cpu_s"] = round(time.process_time() - started, 2)
    out["dump_bytes"] = len(dump)
    out["dump_bytes_per_subject"] = per_subject(len(dump), args.subjects)
    if args.dump_file:
        with open(args.dump_file, "wb") as file:
            file.write(dump)
    return out


def catch_up(args: argparse.Namespace) -> dict[str, Any]:
    """A seed that lost its disk loads the leader's dump (``--dump-file``, written by
    ``--step state``) and installs its caches."""
    with open(args.dump_file, "rb") as file:
        dump = file.read()
    restored: list[CacheSync] = []
    joiner = CoordinationConsumer(lambda batch: None, restored.append, 1000, BUDGET)
    started = time.process_time()
    with gzip.GzipFile(fileobj=io.BytesIO(dump)) as g:
        data = raft_unpickler.load(g)  # type: ignore[arg-type]
    unpickled = time.process_time()
    joiner._deserialize(data)
    deserialized = time.process_time()
    hub = Hub(epoch=UNNUMBERED_EPOCH, numbered_elsewhere=True, cache_memory_budget=BUDGET)
    records = restored[0].subjects
    limit = args.install_limit or len(records)
    install_sync(hub, records[:limit], 0.0)
    installed = time.process_time()
    return {
        "dump_bytes_sent": len(dump),
        "unpickle_cpu_s": round(unpickled - started, 2),
        "deserialize_and_sync_cpu_s": round(deserialized - unpickled, 2),
        "subjects_restored": len(records),
        "subjects_installed": limit,
        "hub_install_cpu_s": round(installed - deserialized, 2),
        "hub_install_us_per_subject": round((installed - deserialized) / limit * 1e6, 2),
    }


STEPS = {"numbering": numbering, "state": state, "catch-up": catch_up}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subjects", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--size", type=int, default=20)
    parser.add_argument("--retained", action="store_true",
                        help="retained messages (each subject keeps a snapshot)")
    parser.add_argument("--step", choices=sorted(STEPS), default="numbering")
    parser.add_argument("--install-limit", type=int, default=0,
                        help="--step catch-up installs only that many subjects (0: all)")
    parser.add_argument("--dump-file", default="",
                        help="--step state writes the dump there; --step catch-up reads it")
    args = parser.parse_args()
    if args.step == "catch-up" and not args.dump_file:
        parser.error("--step catch-up needs --dump-file (written by --step state)")
    out = {"subjects": args.subjects, "retained": args.retained, "size": args.size,
           "step": args.step, **STEPS[args.step](args)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
