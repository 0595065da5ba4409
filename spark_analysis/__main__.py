"""``python -m spark_analysis RUN_DIR [--out REPORT_DIR] [--master MASTER]``: check a
chaos run's history.

RUN_DIR is any directory Spark reads: a local path (default ``--out``: RUN_DIR/report),
``file://``, ``hdfs://`` or ``s3a://`` (then ``--out``, a local directory, is needed).
The same file runs under ``spark-submit`` (``spark-submit --py-files
spark_analysis.zip spark_analysis/__main__.py RUN_DIR --out DIR``; docs/chaos.md).

Exit 0: no violation; 1: at least one; 2: the input is unusable (the message names
every missing file or table) or a usage error. Phase timings go to stderr.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

# Ctrl-C: one line and status 130, during the imports below (pyspark's) too -- what
# migratory/interrupted.py does for the other tools; this package ships without
# migratory (spark-submit --py-files: spark_analysis and chaos only), so it is here.
INTERRUPTED = 130


def _interrupted(*_: object) -> None:
    print("python -m spark_analysis: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
    raise SystemExit(INTERRUPTED)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, _interrupted)

# absolute imports: spark-submit runs this file as a script
from spark_analysis.load import (  # noqa: E402
    UnusableInput,
    check_layout,
    is_local,
    local_path,
)

EXIT_OK, EXIT_VIOLATION, EXIT_UNUSABLE = 0, 1, 2


class Phases:
    """Wall time per phase, printed to stderr as each ends."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t = time.monotonic()

    def restart(self) -> None:
        self._t = time.monotonic()

    def end(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = round(now - self._t, 3)
        self._t = now
        print(f"[spark_analysis] {name}: {self.seconds[name]:.2f} s", file=sys.stderr)


def analyse(spark: Any, run_dir: str, out_dir: Path, phases: Phases) -> dict[str, Any]:
    """Run every check, write the report, return the summary (``ok`` is the verdict)."""
    from spark_analysis import exits, latency, load, outcomes, report, safety, session, timings

    phases.restart()
    history = load.load(spark, run_dir)
    counts = load.counts(history)
    phases.end("load")
    inv = safety.invokes(history)
    violations, examples = safety.check(history, inv)
    crashes, crash_examples = exits.unexpected_exits(history)
    violations[exits.KIND] = {"unexpected_exits": crashes}
    examples[exits.KIND] = {"unexpected_exits": crash_examples}
    phases.end("safety")
    unknown = outcomes.unknown_outcome(history)
    phases.end("unknown_outcome")
    failover, faults = timings.failover(history)
    phases.end("failover")
    lat = latency.latency(history, inv)
    rates = latency.throughput(history)
    phases.end("latency")
    inv.unpersist()
    history.unpersist()
    ok = not any(n for per in violations.values() for n in per.values())
    summary = {
        "ok": ok,
        "run": history.run,
        "violations": violations,
        "examples": examples,
        "unknown_outcome": unknown,
        "failover": failover,
        "latency": lat,
        "counts": counts,
        "spark": session.describe(spark),
        "analysis_seconds": phases.seconds,
    }
    end = max(
        [latency.series_end(rates), failover["publish_unavailability"]["last_ok"] or 0.0]
        + [f["time"] for f in faults]
    )
    extra = {
        "run_dir": run_dir,
        "faults": faults,
        "schedule": history.schedule,
        "fault_windows": timings.fault_windows(faults, end),
        "throughput": rates,
    }
    report.write(out_dir, summary, extra)
    phases.end("report")
    return summary


def main(argv: list[str] | None = None, spark: Any = None) -> int:
    """The CLI; ``spark`` (tests) reuses a session, which is then left running."""
    parser = argparse.ArgumentParser(
        prog="python -m spark_analysis",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "run_dir",
        help="chaos run directory (run.json, history/): a local path or a URI Spark reads "
        "(file://, hdfs://, s3a://)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="local report directory (default RUN_DIR/report for a local RUN_DIR)",
    )
    parser.add_argument(
        "--master",
        help="Spark master (default local[2]; under spark-submit, spark-submit's --master)",
    )
    args = parser.parse_args(argv)
    local = is_local(args.run_dir)
    if args.out is None and not local:
        parser.error(f"--out REPORT_DIR is needed: {args.run_dir} is not a local directory")
    out = args.out or local_path(args.run_dir) / "report"
    try:
        if local:
            check_layout(args.run_dir)  # fail fast, before the ~10 s Spark start
    except UnusableInput as exc:
        print(f"spark_analysis: unusable input: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    try:  # the report's directory, before the analysis (was: a traceback after it)
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"spark_analysis: --out {out}: {exc.strerror}", file=sys.stderr)
        return EXIT_UNUSABLE
    from spark_analysis.session import spark_session

    phases = Phases()
    own = spark is None
    if own:
        try:
            spark = spark_session(master=args.master)
        except Exception as exc:  # a --master Spark refuses, no Java: pyspark's own error
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            print(f"spark_analysis: Spark did not start (--master {args.master or 'default'}):"
                  f" {reason}", file=sys.stderr)
            return EXIT_UNUSABLE
    phases.end("session")
    try:
        summary = analyse(spark, args.run_dir, out, phases)
    except UnusableInput as exc:
        print(f"spark_analysis: unusable input: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    finally:
        if own:
            spark.stop()
    total = sum(phases.seconds.values())
    print(f"[spark_analysis] total: {total:.2f} s; report in {out}", file=sys.stderr)
    bad = {
        f"{kind}.{name}": n
        for kind, per in summary["violations"].items()
        for name, n in per.items()
        if n
    }
    print("OK: no safety violation" if summary["ok"] else f"VIOLATIONS: {bad}")
    code = (summary.get("run") or {}).get("exit_code")
    if code not in (None, 0):
        print(f"NOTE: the chaos run did not finish (runner exit {code}): no final catch-up, "
              "so late acknowledged messages may count as lost")
    return EXIT_OK if summary["ok"] else EXIT_VIOLATION


def _main_interruptible() -> int:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (Spark's own cleanup runs)
    try:
        return main()
    except KeyboardInterrupt:
        _interrupted()
        return INTERRUPTED  # (not reached)


if __name__ == "__main__":
    sys.exit(_main_interruptible())
