"""Write ``summary.json`` and ``report.md`` (with the PNG plots) into the report directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos.schema import VIOLATIONS

from . import plots
from .exits import KIND

FENCE = "```"
MAX_ROWS = 300  # fault schedule rows in report.md


def write(out_dir: Path, summary: dict[str, Any], extra: dict[str, Any]) -> list[Path]:
    """Files written: summary.json, latency.png, throughput.png, report.md."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "summary.json", out_dir / "latency.png", out_dir / "throughput.png"]
    written[0].write_text(json.dumps(summary, indent=2, default=str) + "\n")
    windows = extra["fault_windows"]
    plots.latency_plot(written[1], summary["latency"], windows)
    plots.throughput_plot(written[2], extra["throughput"], windows)
    md = out_dir / "report.md"
    md.write_text("\n".join(markdown(summary, extra)) + "\n")
    return [*written, md]


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return out + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]


def verdict(summary: dict[str, Any]) -> str:
    if summary["ok"]:
        return "**PASS** — no safety violation"
    bad = [
        f"{name} ({kind}: {n})"
        for kind, per in summary["violations"].items()
        for name, n in per.items()
        if n
    ]
    return "**FAIL** — " + ", ".join(bad)


def interrupted_note(run: dict[str, Any]) -> list[str]:
    """A run stopped before its end (Ctrl-C: exit 130) skipped the final heal and
    catch-up, so messages acknowledged in its last seconds can count as lost although no
    subscriber was given the time to recover them: say so next to the verdict (the
    counts stay as found)."""
    code = run.get("exit_code")
    if code in (None, 0):
        return []
    return [
        f"**The run did not finish (runner exit {code}).** It skipped the final heal and "
        "catch-up: a message acknowledged in its last seconds counts as lost if a "
        "subscriber was still recovering when it stopped. Judge only a run that finished.",
        "",
    ]


def settings_note(run: dict[str, Any]) -> list[str]:
    """The config settings the run gave every member (``chaos run --set``), if any."""
    settings = run.get("settings")
    if not isinstance(settings, dict) or not settings:
        return []
    shown = ", ".join(f"{k} = {cell(v)}" for k, v in settings.items())
    return [f"Member settings (`--set`): {shown}", ""]


def markdown(summary: dict[str, Any], extra: dict[str, Any]) -> list[str]:
    run = summary.get("run") or {}
    lines = [f"# Chaos run report: {run.get('run', extra.get('run_dir', ''))}", ""]
    lines += [verdict(summary), ""]
    lines += interrupted_note(run)
    flat = {k: v for k, v in run.items() if not isinstance(v, dict | list)}
    if flat:
        lines += ["Run: " + ", ".join(f"{k}={cell(v)}" for k, v in flat.items()), ""]
    lines += settings_note(run)
    lines += safety_section(summary)
    lines += outcome_section(summary["unknown_outcome"])
    lines += failover_section(summary["failover"])
    lines += latency_section(summary["latency"])
    lines += schedule_section(extra)
    lines += ["", "## Counts", "", "```", json.dumps(summary["counts"], indent=1), "```"]
    lines += ["", "## Analysis phases (s)", ""]
    lines += table(["phase", "seconds"], [[k, v] for k, v in summary["analysis_seconds"].items()])
    return lines


def safety_section(summary: dict[str, Any]) -> list[str]:
    viol = summary["violations"]
    kinds = list(viol)
    lines = ["## Safety", "", "Counts per subscriber kind (sdk: what the SDK hands the app;"]
    lines += ["raw: the protocol-level auditor; mqtt: persistent MQTT sessions, held to MQTT's"]
    lines += ["rules: spark_analysis/mqtt.py; sse: Server-Sent Events streams resumed with"]
    lines += ["Last-Event-ID, held to the sdk/raw rules) and for the member processes (members);"]
    lines += ["- = does not apply.", ""]
    lines += table(
        ["violation", *kinds], [[v] + [viol[k].get(v) for k in kinds] for v in VIOLATIONS]
    )
    for kind in kinds:
        if kind == KIND:
            lines += exits_section(viol[kind], summary["examples"].get(kind, {}))
            continue
        for name in VIOLATIONS:
            exs = summary["examples"].get(kind, {}).get(name, [])
            if not exs:
                continue
            lines += ["", f"### {name} ({kind}): {viol[kind][name]} (first {len(exs)})", ""]
            cols = list(exs[0])
            lines += table(cols, [[e[c] for c in cols] for e in exs])
    return lines


def exits_section(counts: dict[str, int], examples: dict[str, Any]) -> list[str]:
    """Each unexpected member exit with the last lines of that member's log."""
    n, exs = counts.get("unexpected_exits", 0), examples.get("unexpected_exits", [])
    if not n:
        return []
    lines = ["", f"### unexpected_exits (members): {n} (first {len(exs)})"]
    for e in exs:
        tail = str(e["log_tail"] or "(empty log)").replace(FENCE, "` ` `")
        lines += [
            "",
            f"{e['member']} (pid {e['pid']}) exited on its own with status {e['exit_status']} "
            f"at {cell(e['time'])} s; the last lines of its log:",
            "",
            FENCE + "text",
            *tail.splitlines(),
            FENCE,
        ]
    return lines


def outcome_section(uo: dict[str, Any]) -> list[str]:
    lines = ["", "## Unknown-outcome publishes", ""]
    lines += [
        f"{uo['count']} publishes ended `info` (outcome unknown): {uo['delivered']} later "
        f"delivered, {uo['not_delivered']} never delivered — both allowed. "
        f"{uo['failed_but_delivered']} `fail` publishes were delivered anyway.",
    ]
    cols = ["msg_id", "subject", "member", "time", "reason", "first_delivery", "deliveries"]
    for key, title in (
        ("examples_delivered", "info, later delivered"),
        ("examples_not_delivered", "info, never delivered"),
        ("examples_failed_but_delivered", "fail, delivered anyway"),
    ):
        if uo[key]:
            lines += ["", f"{title} (first {len(uo[key])}):", ""]
            lines += table(cols, [[r.get(c) for c in cols] for r in uo[key]])
    return lines


def _stats_row(label: str, s: dict[str, Any], *tail: Any) -> list[Any]:
    return [label, s["count"], s["p50"], s["p90"], s["max"], *tail]


def failover_section(fo: dict[str, Any]) -> list[str]:
    le = fo["leader_election"]
    lines = ["", "## Failover", "", "### New Raft leader after a leader kill / pause", ""]
    lines += table(
        ["", "count", "p50 s", "p90 s", "max s", "no new leader"],
        [_stats_row("seconds", le["stats"], le["no_new_leader"])],
    )
    if le["events"]:
        heads = ["time", "fault", "old leader", "new leader", "seconds"]
        keys = ["time", "fault", "target", "new_leader", "seconds"]
        lines += ["", *table(heads, [[e[k] for k in keys] for e in le["events"]])]
    rs = fo["subscriber_resume"]
    lines += ["", "### Subscriber resume (SERVER_DOWN → next DATA_SYNC / DATA_RESYNC)", ""]
    lines += table(
        ["kind", "count", "p50 s", "p90 s", "max s", "never resumed"],
        [_stats_row(k, v["stats"], v["never_resumed"]) for k, v in rs.items()],
    )
    slow = [(k, r) for k, v in rs.items() for r in v["slow_or_never"]]
    if slow:
        lines += ["", "Slow (> 5 s) or never resumed:", ""]
        lines += table(
            ["kind", "subscriber", "down", "resumed"],
            [[k, r["subscriber"], r["down"], r["resumed"]] for k, r in slow],
        )
    pu = fo["publish_unavailability"]
    lines += ["", f"### Publish unavailability (gaps > {pu['threshold']} s between oks)", ""]
    lines += [
        f"{len(pu['windows'])} windows, {pu['total_seconds']} s in total, longest "
        f"{pu['longest']} s (first ok {cell(pu['first_ok'])} s, last ok "
        f"{cell(pu['last_ok'])} s).",
    ]
    if pu["windows"]:
        rows = [[w["start"], w["end"], w["seconds"]] for w in pu["windows"][:50]]
        lines += ["", *table(["start", "end", "seconds"], rows)]
    return lines


def latency_section(lat: dict[str, Any]) -> list[str]:
    o = lat["overall"]
    lines = ["", "## Delivery latency", "", f"Scope: {lat['scope']}.", ""]
    cols = ["count", "p50_ms", "p90_ms", "p99_ms", "max_ms"]
    lines += table(
        ["bucket start s", "count", "p50 ms", "p90 ms", "p99 ms", "max ms"],
        [["overall", *(o[c] for c in cols)]]
        + [[b["start"], *(b[c] for c in cols)] for b in lat["buckets"]],
    )
    lines += ["", "![latency](latency.png)", "", "![throughput](throughput.png)"]
    lines += ["", "Shaded: fault windows (nemesis start → target whole again)."]
    return lines


def schedule_section(extra: dict[str, Any]) -> list[str]:
    sched = extra["faults"]
    windows = extra["fault_windows"]
    planned = extra.get("schedule")
    lines = ["", "## Fault schedule as applied (nemesis table)", ""]
    if planned is None:
        lines += ["(no schedule.jsonl in the run directory)", ""]
    else:
        lines += [f"{len(planned)} faults planned (schedule.jsonl), {len(windows)} applied.", ""]
    lines += table(
        ["time", "fault", "target", "phase", "detail"],
        [[f["time"], f["fault"], f["target"], f["phase"], f["detail"]] for f in sched[:MAX_ROWS]],
    )
    if len(sched) > MAX_ROWS:
        lines.append(f"… {len(sched) - MAX_ROWS} more")
    if windows:
        lines += ["", "Fault windows:", ""]
        lines += table(
            ["start", "end", "seconds", "fault"],
            [[w["start"], w["end"], w["end"] - w["start"], w["label"]] for w in windows],
        )
    return lines
