"""Write ``summary.json`` and ``report.md`` (with the PNG plots) into the report directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos.schema import VIOLATIONS

from . import plots


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value).replace("|", "\\|")


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return out


def write(out_dir: Path, summary: dict[str, Any], extra: dict[str, Any]) -> list[Path]:
    """Files written: summary.json, report.md, latency.png, throughput.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "summary.json"]
    written[0].write_text(json.dumps(summary, indent=2, sort_keys=False, default=str) + "\n")
    windows = extra["fault_windows"]
    plots.latency_plot(out_dir / "latency.png", summary["latency"], windows)
    plots.throughput_plot(out_dir / "throughput.png", extra["throughput"], windows)
    written += [out_dir / "latency.png", out_dir / "throughput.png"]
    md = out_dir / "report.md"
    md.write_text("\n".join(markdown(summary, extra)) + "\n")
    written.append(md)
    return written


def markdown(summary: dict[str, Any], extra: dict[str, Any]) -> list[str]:
    run = extra.get("run", {})
    verdict = "PASS — no safety violation" if summary["ok"] else "FAIL — safety violations"
    lines = [f"# Chaos run report: {extra.get('run_dir', '')}", "", f"**Verdict: {verdict}**", ""]
    if run:
        lines += [
            "Run: "
            + ", ".join(
                f"{k}={_cell(v)}" for k, v in run.items() if not isinstance(v, dict | list)
            ),
            "",
        ]
    viol = summary["violations"]
    kinds = list(viol)
    lines += ["## Safety", ""]
    lines += _table(
        ["violation", *kinds], [[v] + [viol[k].get(v, 0) for k in kinds] for v in VIOLATIONS]
    )
    for kind in kinds:
        for name in VIOLATIONS:
            exs = summary["examples"].get(kind, {}).get(name, [])
            if not exs:
                continue
            lines += ["", f"### {name} ({kind}): {viol[kind][name]} (first {len(exs)})", ""]
            cols = list(exs[0])
            lines += _table(cols, [[e[c] for c in cols] for e in exs])
    uo = summary["unknown_outcome"]
    lines += [
        "",
        "## Unknown outcome publishes",
        "",
        f"{uo['count']} publishes ended `info`: {uo['delivered']} later delivered, "
        f"{uo['not_delivered']} never delivered. {uo['failed_but_delivered']} `fail` "
        "publishes were delivered anyway.",
    ]
    fo = summary["failover"]
    le = fo["leader_election"]
    lines += ["", "## Failover", "", "### New Raft leader after leader kill/pause", ""]
    lines += _table(
        ["count", "p50 s", "p90 s", "max s", "no new leader"],
        [
            [
                le["stats"]["count"],
                le["stats"]["p50"],
                le["stats"]["p90"],
                le["stats"]["max"],
                le["no_new_leader"],
            ]
        ],
    )
    if le["events"]:
        heads = ["time", "fault", "old leader", "new leader", "seconds"]
        keys = ["time", "fault", "target", "new_leader", "seconds"]
        lines += ["", *_table(heads, [[e[k] for k in keys] for e in le["events"]])]
    lines += ["", "### Subscriber resume (SERVER_DOWN → DATA_SYNC/DATA_RESYNC)", ""]
    rs = fo["subscriber_resume"]
    lines += _table(
        ["kind", "count", "p50 s", "p90 s", "max s", "never resumed"],
        [
            [
                k,
                v["stats"]["count"],
                v["stats"]["p50"],
                v["stats"]["p90"],
                v["stats"]["max"],
                v["never_resumed"],
            ]
            for k, v in rs.items()
        ],
    )
    pu = fo["publish_unavailability"]
    lines += [
        "",
        f"### Publish unavailability (gaps > {pu['threshold']} s between publish oks)",
        "",
        f"{len(pu['windows'])} windows, {pu['total_seconds']} s in total, longest "
        f"{pu['longest']} s.",
        "",
    ]
    if pu["windows"]:
        lines += _table(
            ["start", "end", "seconds"],
            [[w["start"], w["end"], w["seconds"]] for w in pu["windows"][:50]],
        )
    lat = summary["latency"]
    o = lat["overall"]
    lines += ["", "## Delivery latency", "", f"Scope: {lat['scope']}.", ""]
    lines += _table(
        ["bucket start s", "count", "p50 ms", "p90 ms", "p99 ms", "max ms"],
        [["overall", o["count"], o["p50_ms"], o["p90_ms"], o["p99_ms"], o["max_ms"]]]
        + [
            [b["start"], b["count"], b["p50_ms"], b["p90_ms"], b["p99_ms"], b["max_ms"]]
            for b in lat["buckets"]
        ],
    )
    lines += ["", "![latency](latency.png)", "", "![throughput](throughput.png)", ""]
    lines += ["## Fault schedule (as applied, from nemesis)", ""]
    sched = extra["faults"]
    lines += _table(
        ["time", "fault", "target", "phase", "detail"],
        [[f["time"], f["fault"], f["target"], f["phase"], f["detail"]] for f in sched[:300]],
    )
    if len(sched) > 300:
        lines.append(f"… {len(sched) - 300} more")
    c = summary["counts"]
    lines += ["", "## Counts", "", "```", json.dumps(c, indent=1), "```"]
    if extra.get("phases"):
        lines += ["", "## Analysis phases (s)", ""]
        lines += _table(["phase", "seconds"], [[k, v] for k, v in extra["phases"].items()])
    return lines
