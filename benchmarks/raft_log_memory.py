"""Does a seed hold its Raft log in memory until it compacts it, beside its caches?

Starts three seeds, then publishes acknowledged ``--size``-byte messages to ONE subject
(so the message caches stay at MaxCachedMessagesPerSubject, a few hundred kB) at
``--rate`` for ``--chunks`` x ``--chunk`` seconds; after each chunk, each seed's VmRSS,
its ``raft.journal`` (the file's size, and its records' bytes: the header's end of
records) and whether it compacted (``raft.dump`` present). pysyncobj's FileJournal
keeps every record it writes in a Python list as well (``(command, idx, term)``), so
until a compaction a seed's memory grows with its log, whatever the caches' budgets.

    .venv/bin/python benchmarks/raft_log_memory.py --rate 10000 --chunks 4 --chunk 10 \
        [--log-bytes 8388608]
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_common import BenchCluster
from pysyncobj.journal import LAST_RECORD_OFFSET_OFFSET

from migratory.bench.procfs import handle_sigterm, machine_description
from migratory.bench.publisher import publish_paced

MIB = 1 << 20


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def journal_mib(data_dir: Path) -> dict[str, float | bool]:
    journal = data_dir / "raft.journal"
    records = 0
    if journal.exists():
        with journal.open("rb") as file:
            file.seek(LAST_RECORD_OFFSET_OFFSET)
            records = struct.unpack("<I", file.read(4))[0]
    return {
        "file_mib": round(journal.stat().st_size / MIB, 1) if journal.exists() else 0.0,
        "records_mib": round(records / MIB, 1),
        "compacted": (data_dir / "raft.dump").exists(),
    }


def data_dirs(cluster: BenchCluster) -> list[Path]:
    return [Path(cluster.settings[i]["ClusterDataDir"]) for i in range(3)]


def sample(cluster: BenchCluster, acked: int) -> dict[str, object]:
    return {
        "acked": acked,
        "rss_mib": [rss_mib(cluster.pid(i)) for i in range(3)],
        "journal": [journal_mib(d) for d in data_dirs(cluster)],
        "cached_messages": [cluster.stats(i).get("cached_messages") for i in range(3)],
    }


def run(args: argparse.Namespace) -> dict[str, object]:
    extra = {"ClusterLogCompactionBytes": str(args.log_bytes)} if args.log_bytes else {}
    with BenchCluster("raft-log-memory", members=3, seeds=3, extra=extra) as cluster:
        cluster.start_all()
        cluster.wait_ready([0, 1, 2], timeout=60)
        time.sleep(1)
        samples = [sample(cluster, 0)]
        acked = 0
        for _ in range(args.chunks):
            result = publish_paced("127.0.0.1", cluster.port(0), rate=args.rate,
                                   duration=args.chunk, size=args.size, subjects=1)
            acked += int(result.get("acks") or 0)
            time.sleep(1)
            samples.append(sample(cluster, acked))
        first, last = samples[0], samples[-1]
        grown = [b - a for a, b in zip(first["rss_mib"], last["rss_mib"], strict=True)]  # type: ignore[call-overload]
        return {
            "machine": machine_description(),
            "size": args.size,
            "rate": args.rate,
            "log_bytes": args.log_bytes or "default",
            "samples": samples,
            "rss_grown_mib": grown,
            "rss_bytes_per_acked_publish": [round(g * MIB / max(1, acked)) for g in grown],
            "logs": str(cluster.log_dir),
        }


def main() -> None:
    handle_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rate", type=float, default=10_000)
    parser.add_argument("--chunks", type=int, default=3)
    parser.add_argument("--chunk", type=float, default=10.0, help="seconds per chunk")
    parser.add_argument("--log-bytes", type=int, default=0,
                        help="ClusterLogCompactionBytes (default: the server's)")
    print(json.dumps(run(parser.parse_args()), indent=2))


if __name__ == "__main__":
    main()
