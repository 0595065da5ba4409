#!/usr/bin/env python3
"""Workers = 1 against Workers = 2 (or ``--workers 1,2,4``): the fan-out benchmark
(benchmarks/fanout.py, i.e. ``migratory bench fanout``; same load, same options) run
once per worker count, then a table.

    .venv/bin/python benchmarks/workers_fanout.py                      # 1000 subscribers,
    .venv/bin/python benchmarks/workers_fanout.py --rate 400 --duration 20   # 100 msg/s ...
    .venv/bin/python benchmarks/workers_fanout.py --workers 1,2 --subscribers 10000 \\
        --subjects 10000 --rate 20000                                  # many subjects

Every option after the known ones goes to fanout.py as is. Server CPU is the sum over
all the server's processes (the supervisor and its workers); the server's counters and
its longest loop stall are merged from every worker's /stats. On a machine with fewer
cores than workers + load generator, more workers compete with the load for the same
cores: read the machine CPU line (docs/workers.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def server_cpu(cpu: dict[str, float]) -> float:
    """CPU % of the server: the supervisor and its workers."""
    return sum(v for k, v in cpu.items() if k.startswith("server"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    parser.add_argument("--json", metavar="FILE", help="write every run's results as JSON")
    args, fanout_args = parser.parse_known_args(argv)
    counts = [int(n) for n in args.workers.split(",")]
    results: dict[int, dict] = {}
    for count in counts:
        print(f"\n=== Workers = {count} ===", flush=True)
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            code = subprocess.call([
                sys.executable, str(HERE / "fanout.py"), *fanout_args,
                "--set", f"Workers={count}", "--json", out.name,
            ])
            text = Path(out.name).read_text()
        if not text:
            print(f"Workers = {count}: the run failed (exit {code})", file=sys.stderr)
            return 1
        results[count] = json.loads(text)["results"][0]
    print("\nworkers  deliveries/s   p50 ms   p99 ms  p99.9 ms   max ms  all delivered  "
          "server CPU %  machine CPU %")
    for count, result in results.items():
        lat, cpu = result["latency_ms"], result["cpu_percent"]
        print(f"{count:>7}  {result['deliveries_per_second']:>12,.0f}  {lat['p50']:>7.1f}  "
              f"{lat['p99']:>7.1f}  {lat['p99.9']:>8.1f}  {lat['max']:>7.1f}  "
              f"{'yes' if result['all_delivered'] else 'NO':>13}  "
              f"{server_cpu(cpu):>12.0f}  {cpu['machine']:>13.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
