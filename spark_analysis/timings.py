"""Failover timings: new Raft leader, subscriber resume, publish unavailability.

The nemesis and cluster tables, the subscriptions' connection events and the publish oks'
times are small enough to collect; the arithmetic on them is pure functions below.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from .load import History

LEADER_FAULTS = ("kill", "pause", "stop")  # stop: a SIGTERM (the member drains, exits)
HEALING = ("restart", "resume", "heal", "join")  # faults that make a target whole again
UNAVAILABLE_GAP = 0.5  # seconds between consecutive publish oks
LEADER_LOOKBACK = 5.0  # seconds: the last leader sample before a fault must be this recent
SLOW_RESUME = 5.0  # seconds: resumes listed by name
MAX_LISTED = 50


def stats(values: Sequence[float]) -> dict[str, Any]:
    """count, p50, p90, max, mean (nearest-rank percentiles), rounded to 0.1 ms."""
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


def leader_elections(
    faults: Sequence[dict[str, Any]], leaders: Sequence[tuple[float, str]]
) -> dict[str, Any]:
    """For each kill/pause/stop start whose target led Raft: seconds until another member leads.

    ``leaders``: (time, member) of every cluster sample in which that member was up and
    leader, in time order. The target led if the last such sample within
    :data:`LEADER_LOOKBACK` s before the fault names it, or the fault's detail says
    "leader". Resolution is the sampling period.
    """
    times = [t for t, _ in leaders]
    events = []
    for f in faults:
        if f["fault"] not in LEADER_FAULTS or f["phase"] != "start":
            continue
        t0, target = f["time"], f["target"]
        i = bisect.bisect_right(times, t0)
        was_leader = i > 0 and times[i - 1] >= t0 - LEADER_LOOKBACK and leaders[i - 1][1] == target
        if not was_leader and "leader" not in str(f.get("detail") or "").lower():
            continue
        new = next(((t, m) for t, m in leaders[i:] if m != target), None)
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
    return {"events": events, "stats": stats(done), "no_new_leader": len(events) - len(done)}


def subscriber_resume(events: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per subscriber kind: each SERVER_DOWN until that subscriber's next DATA_SYNC /
    DATA_RESYNC (any subject), or for an MQTT subscriber its next SERVER_UP (a CONNACK
    with its session: MQTT has no DATA_SYNC). ``events`` in time order (file order on
    ties)."""
    pending: dict[tuple[str, str], list[float]] = {}
    done: dict[str, list[tuple[str, float, float | None]]] = {"sdk": [], "raw": []}
    for e in events:
        who = (str(e["kind"]), str(e["subscriber"]))
        if e["event"] == "SERVER_DOWN":
            pending.setdefault(who, []).append(e["time"])
        elif who in pending:
            for down in pending.pop(who):
                done.setdefault(who[0], []).append((who[1], down, e["time"]))
    for (kind, subscriber), downs in pending.items():
        done.setdefault(kind, []).extend((subscriber, d, None) for d in downs)
    out: dict[str, Any] = {}
    for kind, rows in sorted(done.items()):
        took = [up - down for _, down, up in rows if up is not None]
        slow = [
            {"subscriber": s, "down": down, "resumed": up}
            for s, down, up in sorted(rows, key=lambda row: row[1])
            if up is None or up - down > SLOW_RESUME
        ]
        out[kind] = {
            "stats": stats(took),
            "never_resumed": len(rows) - len(took),
            "slow_or_never": slow[:MAX_LISTED],
        }
    return out


def publish_unavailability(oks: Sequence[float]) -> dict[str, Any]:
    """Gaps longer than :data:`UNAVAILABLE_GAP` between consecutive publish oks."""
    times = sorted(oks)
    windows = [
        {"start": round(a, 4), "end": round(b, 4), "seconds": round(b - a, 4)}
        for a, b in itertools.pairwise(times)
        if b - a > UNAVAILABLE_GAP
    ]
    return {
        "threshold": UNAVAILABLE_GAP,
        "windows": windows,
        "total_seconds": round(sum(w["seconds"] for w in windows), 4),
        "longest": max((w["seconds"] for w in windows), default=0.0),
        "first_ok": times[0] if times else None,
        "last_ok": times[-1] if times else None,
    }


def fault_windows(faults: Sequence[dict[str, Any]], end: float) -> list[dict[str, Any]]:
    """(start, end, label) per applied fault, ``faults`` in time order.

    A fault's ``start`` opens its window; it closes when the target is whole again: at
    the end of the healing fault (restart, resume, heal, join) of the same target that
    follows the fault's own ``end``, else at that ``end``, else at ``end`` (run end).
    E.g. kill start -> kill end -> restart start -> restart end (ready) is one window.
    """
    out = []
    for i, f in enumerate(faults):
        if f["phase"] != "start" or f["fault"] in HEALING:
            continue
        stop: float | None = None
        for g in faults[i + 1 :]:
            if g["target"] != f["target"]:
                continue
            if g["fault"] == f["fault"] and g["phase"] == "end":
                stop = g["time"]  # its own end; a healer may still follow
            elif g["fault"] in HEALING:
                stop = g["time"]
                if g["phase"] == "end":
                    break
            elif g["phase"] == "start":
                break  # the next fault of this target
        out.append(
            {
                "start": f["time"],
                "end": end if stop is None else stop,
                "label": f"{f['fault']} {f['target']}",
            }
        )
    return out


def nemesis_rows(history: History) -> list[dict[str, Any]]:
    rows = history["nemesis"].orderBy("time", "_line").collect()
    return [{k: r[k] for k in ("time", "fault", "target", "phase", "detail")} for r in rows]


def failover(history: History) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(failover summary, nemesis rows as applied)``."""
    from pyspark.sql import functions as F

    faults = nemesis_rows(history)
    leaders = [
        (r["time"], r["member"])
        for r in history["cluster"]
        .where((F.col("raft_state") == "leader") & F.coalesce(F.col("up"), F.lit(True)))
        .orderBy("time", "_line")
        .select("time", "member")
        .collect()
    ]
    conn = (
        history["subscriptions"]
        .where(
            F.col("event").isin("SERVER_DOWN", "DATA_SYNC", "DATA_RESYNC")
            | ((F.col("kind") == "mqtt") & (F.col("event") == "SERVER_UP"))
        )
        .orderBy("time", "_line")
        .select("kind", "subscriber", "event", "time")
        .collect()
    )
    oks = history["publishes"].where(F.col("type") == "ok").select("time").collect()
    result = {
        "leader_election": leader_elections(faults, leaders),
        "subscriber_resume": subscriber_resume(r.asDict() for r in conn),
        "publish_unavailability": publish_unavailability([r["time"] for r in oks]),
    }
    return result, faults
