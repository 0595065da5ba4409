"""``python -m spark_analysis RUN_DIR [--out REPORT_DIR]``: check a chaos run's history.

Exit 0: no safety violation; 1: at least one; 2: the input is unusable (the message
names the missing table or file).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from .load import UnusableInput, check_layout


def analyse(spark: Any, run_dir: Path, out_dir: Path, phases: dict[str, float]) -> dict[str, Any]:
    """Run every check, write the report, return the summary (``ok`` is the verdict)."""
    from . import latency, load, report, safety, timings

    def phase(name: str, start: float) -> float:
        now = time.monotonic()
        phases[name] = round(now - start, 3)
        print(f"[spark_analysis] {name}: {phases[name]:.2f} s", file=sys.stderr)
        return now

    t = time.monotonic()
    history = load.load(spark, run_dir)
    t = phase("load", t)
    counts = load.counts(history)
    t = phase("counts", t)
    violations, examples = safety.check(history)
    t = phase("safety", t)
    unknown = safety.unknown_outcome(history)
    t = phase("unknown_outcome", t)
    failover, faults = timings.failover(history)
    t = phase("failover", t)
    lat = latency.latency(history, safety.invokes(history))
    rates = latency.throughput(history)
    t = phase("latency", t)
    ok = not any(n for per in violations.values() for n in per.values())
    summary = {
        "ok": ok,
        "violations": violations,
        "examples": examples,
        "unknown_outcome": unknown,
        "failover": failover,
        "latency": lat,
        "counts": counts,
    }
    end = max([counts_end(rates), *(f["time"] for f in faults)], default=0.0)
    extra = {
        "run": history.run,
        "run_dir": str(run_dir),
        "faults": faults,
        "fault_windows": timings.fault_windows(faults, end),
        "throughput": rates,
        "phases": phases,
    }
    report.write(out_dir, summary, extra)
    phase("report", t)
    history.unpersist()
    return summary


def counts_end(rates: dict[str, list[tuple[float, int]]]) -> float:
    return max((p[-1][0] + 1.0 for p in rates.values() if p), default=0.0)


def main(argv: list[str] | None = None, spark: Any = None) -> int:
    """The CLI; ``spark`` (tests) reuses a session, which is then left running."""
    parser = argparse.ArgumentParser(prog="python -m spark_analysis", description=__doc__)
    parser.add_argument("run_dir", type=Path, help="chaos run directory (run.json, history/)")
    parser.add_argument("--out", type=Path, help="report directory (default RUN_DIR/report)")
    args = parser.parse_args(argv)
    out = args.out or args.run_dir / "report"
    try:
        check_layout(args.run_dir)  # fail fast, before the 10 s Spark start
    except UnusableInput as exc:
        print(f"spark_analysis: unusable input: {exc}", file=sys.stderr)
        return 2
    from .session import spark_session

    phases: dict[str, float] = {}
    t0 = time.monotonic()
    own = spark is None
    if own:
        spark = spark_session()
    phases["session"] = round(time.monotonic() - t0, 3)
    print(f"[spark_analysis] session: {phases['session']:.2f} s", file=sys.stderr)
    try:
        summary = analyse(spark, args.run_dir, out, phases)
    except UnusableInput as exc:
        print(f"spark_analysis: unusable input: {exc}", file=sys.stderr)
        return 2
    finally:
        if own:
            spark.stop()
    total = sum(phases.values())
    print(f"[spark_analysis] total: {total:.2f} s; report in {out}", file=sys.stderr)
    bad = {
        f"{kind}.{name}": n
        for kind, per in summary["violations"].items()
        for name, n in per.items()
        if n
    }
    print("OK: no safety violation" if summary["ok"] else f"VIOLATIONS: {bad}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
