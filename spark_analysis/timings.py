"""Failover timings: new Raft leader, subscriber resume, publish unavailability.

The nemesis and cluster tables are small (one row per fault, one sample per member
every few hundred ms) and are collected; the subscription and publish tables stay in
Spark until reduced.
"""

from __future__ import annotations

import bisect
import itertools
from typing import Any

from .load import History

LEADER_FAULTS = ("kill", "pause")
UNAVAILABLE_GAP = 0.5  # seconds between consecutive publish oks
MAX_LISTED = 50


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0, "p50": None, "p90": None, "max": None, "mean": None}
    xs = sorted(values)

    def pct(p: float) -> float:
        return round(xs[min(len(xs) - 1, int(p * len(xs)))], 4)

    return {
        "count": len(xs),
        "p50": pct(0.5),
        "p90": pct(0.9),
        "max": round(xs[-1], 4),
        "mean": round(sum(xs) / len(xs), 4),
    }


def nemesis_rows(history: History) -> list[dict[str, Any]]:
    rows = history["nemesis"].orderBy("time", "_line").collect()
    return [{k: r[k] for k in ("time", "fault", "target", "phase", "detail")} for r in rows]


def leader_elections(history: History, faults: list[dict[str, Any]]) -> dict[str, Any]:
    """For each kill/pause start whose target led Raft: seconds until another member leads."""
    samples = history["cluster"].orderBy("time", "_line").collect()
    leads = [
        (r["time"], r["member"])
        for r in samples
        if r["raft_state"] == "leader" and r["up"] is not False
    ]
    times = [t for t, _ in leads]
    events = []
    for f in faults:
        if f["fault"] not in LEADER_FAULTS or f["phase"] != "start":
            continue
        t0, target = f["time"], f["target"]
        i = bisect.bisect_right(times, t0)
        before = [m for t, m in leads[max(0, i - 50) : i] if t >= t0 - 5.0]
        was_leader = bool(before) and before[-1] == target
        if not was_leader and "leader" not in str(f.get("detail") or "").lower():
            continue
        new = next(((t, m) for t, m in leads[i:] if m != target), None)
        events.append(
            {
                "time": t0,
                "fault": f["fault"],
                "target": target,
                "new_leader": new[1] if new else None,
                "seconds": round(new[0] - t0, 4) if new else None,
            }
        )
    done = [e["seconds"] for e in events if e["seconds"] is not None]
    return {"events": events, "stats": _stats(done), "no_new_leader": len(events) - len(done)}


def subscriber_resume(history: History) -> dict[str, Any]:
    """Per subscriber kind: SERVER_DOWN until the next DATA_SYNC / DATA_RESYNC."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    subs = history["subscriptions"].where(
        F.col("event").isin("SERVER_DOWN", "DATA_SYNC", "DATA_RESYNC")
    )
    w = (
        Window.partitionBy("kind", "subscriber")
        .orderBy("time", "_line")
        .rowsBetween(1, Window.unboundedFollowing)
    )
    sync = F.when(F.col("event") != "SERVER_DOWN", F.col("time"))
    downs = (
        subs.withColumn("resumed", F.min(sync).over(w))
        .where(F.col("event") == "SERVER_DOWN")
        .select("kind", "subscriber", "time", "resumed")
        .collect()
    )
    out: dict[str, Any] = {}
    for kind in sorted({r["kind"] for r in downs} | {"sdk", "raw"}):
        mine = [r for r in downs if r["kind"] == kind]
        done = [r["resumed"] - r["time"] for r in mine if r["resumed"] is not None]
        slow = sorted(
            (
                {"subscriber": r["subscriber"], "down": r["time"], "resumed": r["resumed"]}
                for r in mine
                if r["resumed"] is None or r["resumed"] - r["time"] > 5.0
            ),
            key=lambda e: e["down"],
        )
        out[kind] = {
            "stats": _stats(done),
            "never_resumed": len(mine) - len(done),
            "slow_or_never": slow[:MAX_LISTED],
        }
    return out


def publish_unavailability(history: History) -> dict[str, Any]:
    """Gaps longer than 0.5 s between consecutive publish oks (all publishers)."""
    from pyspark.sql import functions as F

    oks = sorted(
        r["time"]
        for r in history["publishes"].where(F.col("type") == "ok").select("time").collect()
    )
    windows = [
        {"start": round(a, 4), "end": round(b, 4), "seconds": round(b - a, 4)}
        for a, b in itertools.pairwise(oks)
        if b - a > UNAVAILABLE_GAP
    ]
    return {
        "threshold": UNAVAILABLE_GAP,
        "windows": windows,
        "total_seconds": round(sum(w["seconds"] for w in windows), 4),
        "longest": max((w["seconds"] for w in windows), default=0.0),
        "first_ok": oks[0] if oks else None,
        "last_ok": oks[-1] if oks else None,
    }


def fault_windows(faults: list[dict[str, Any]], end: float) -> list[dict[str, Any]]:
    """(start, end, label) per applied fault: a start closes at its end phase, or at the
    healing fault (restart, resume, heal, join) of the same target, else at run end."""
    closers = {"kill": "restart", "pause": "resume", "partition": "heal", "leave": "join"}
    out = []
    for i, f in enumerate(faults):
        if f["phase"] != "start" or f["fault"] in closers.values():
            continue
        stop = end
        for g in faults[i + 1 :]:
            same = g["target"] == f["target"] or g["fault"] == "heal"
            ends = (g["fault"] == f["fault"] and g["phase"] == "end") or g["fault"] == closers.get(
                f["fault"]
            )
            if same and ends:
                stop = g["time"]
                break
        out.append({"start": f["time"], "end": stop, "label": f"{f['fault']} {f['target']}"})
    return out


def failover(history: History) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    faults = nemesis_rows(history)
    result = {
        "leader_election": leader_elections(history, faults),
        "subscriber_resume": subscriber_resume(history),
        "publish_unavailability": publish_unavailability(history),
    }
    return result, faults
