"""The fan-out benchmark's result: the load processes' figures merged, judged and printed."""

from __future__ import annotations

import argparse
import multiprocessing as mp
from collections import Counter

from _fanout_stamp import expected_for
from _latency import dense, merge_hist, percentiles_ms

QUANTILES = (0.5, 0.9, 0.99, 0.999)
TARGET_P99_MS = 50.0


def summarise(args: argparse.Namespace, figures: dict) -> dict:
    """Merge the load processes' histograms and counts into the figures we report."""
    published, results, cpu = figures["published"], figures["results"], figures["cpu"]
    subscribed = figures["subscribed"]
    hist = merge_hist([dense(r["hist"]) for r in results])
    received = sum(r["received"] for r in results)
    subjects = getattr(args, "subjects", 1)
    expected = sum(
        expected_for(i, subjects, published["sent"]) for i in range(args.subscribers)
    )
    per_conn: Counter[int] = Counter()  # received - expected -> subscribers
    closes: Counter[str] = Counter()
    for r in results:
        per_conn.update({int(k): v for k, v in r["per_conn_delta"].items()})
        closes.update(r["closes"])
    short = sum(v for k, v in per_conn.items() if k < 0)
    extra = sum(v for k, v in per_conn.items() if k > 0)
    latency = percentiles_ms(hist, QUANTILES)
    latency["max"] = max(r["max_ns"] for r in results) / 1e6
    gaps = loop_gap_in_window(figures["stats_after"], figures.get("window", (0.0, 0.0)))
    load_cpu = sum(v for k, v in cpu.items() if k.startswith(("subscribers", "publisher")))
    all_delivered = received == expected and short == 0 and subscribed == args.subscribers
    passed = all_delivered and latency["p99"] <= TARGET_P99_MS
    before, after = figures["stats_before"], figures["stats_after"]
    server_counters = {
        key: after[key] - before.get(key, 0)
        for key in ("writes", "bytes_written", "frames_fanned_out", "slow_consumers")
        if key in after
    }
    return {
        "benchmark": "fanout",
        "settings": args.set,
        "subscribers": args.subscribers,
        "subjects": subjects,
        "loop_gap_max_ms": gaps,
        "subscribed": subscribed,
        "rate": args.rate,
        "size": args.size,
        "duration": args.duration,
        "procs": args.procs,
        "setup_seconds": figures["setup_seconds"],
        "setup_failures": figures["setup_failures"],
        "published": published,
        "deliveries_expected": expected,
        "deliveries_received": received,
        "deliveries_per_second": received / max(published["seconds"], 1e-9),
        "subscribers_short": short,
        "subscribers_extra": extra,
        "subscriber_counts_off": {str(k): v for k, v in sorted(per_conn.items()) if k != 0},
        "closes": dict(closes),
        "latency_ms": latency,
        "cpu_percent": cpu,
        "load_generator_cpu_percent": load_cpu,
        "subscriber_recvs": sum(r["recvs"] for r in results),
        "subscriber_polls": sum(r["polls"] for r in results),
        "server_rss_kib": {"before": figures["rss_before"], "after": figures["rss_after"]},
        "server_counters": server_counters,
        "all_delivered": all_delivered,
        "pass": passed,
    }


def loop_gap_in_window(stats: dict, window: tuple[float, float]) -> float | None:
    """The server's largest event-loop gap (ms) in the publishing window (its /stats keep
    the largest gap of each monotonic second, migratory/server/loop_gaps.py)."""
    per_second = (stats.get("loop_gaps") or {}).get("per_second") or []
    start, end = window
    inside = [gap for second, gap in per_second if int(start) <= second <= int(end)]
    return max(inside) if inside else None


def report(result: dict) -> None:
    lat = result["latency_ms"]
    pub = result["published"]
    cpu = result["cpu_percent"]
    print()
    print(f"settings             : {' '.join(result['settings']) or '(defaults)'}")
    print(
        f"published            : {pub['sent']} in {pub['seconds']:.2f} s "
        f"(schedule lateness mean {pub['late_mean_ms']:.2f} ms, max {pub['late_max_ms']:.2f} ms)"
    )
    print(
        f"deliveries           : {result['deliveries_received']} / "
        f"{result['deliveries_expected']} expected "
        f"({result['deliveries_per_second']:,.0f}/s); "
        f"{result['subscribers_short']} subscribers short, {result['subscribers_extra']} over"
    )
    print("latency ms           : " + ", ".join(f"{k} {v:.1f}" for k, v in lat.items()))
    gap = result.get("loop_gap_max_ms")
    print(
        "longest loop stall   : "
        + ("not reported by the server" if gap is None else f"{gap:.1f} ms")
        + f" ({result.get('subjects', 1)} subject(s), {result['subscribers']} subscribers)"
    )
    if pub["acks"]:
        ack = pub["ack_ms"]
        print(
            f"publish ack ms       : p50 {ack['p50']:.1f}, p90 {ack['p90']:.1f}, "
            f"p99 {ack['p99']:.1f}, max {ack['max']:.1f} ({pub['acks']} acks)"
        )
    print(f"publish statuses     : {pub['statuses']}")
    print(
        f"server CPU           : {cpu['server']:.0f} %  (RSS {result['server_rss_kib']['before']}"
        f" -> {result['server_rss_kib']['after']} KiB)"
    )
    print(
        f"load generator CPU   : {result['load_generator_cpu_percent']:.0f} % "
        + "("
        + ", ".join(
            f"{k} {v:.0f}" for k, v in cpu.items() if k.startswith(("subscribers", "publisher"))
        )
        + ")"
    )
    counters = result["server_counters"]
    if counters.get("writes"):
        print(
            f"server writes        : {counters['writes'] / cpu['wall_seconds']:,.0f}/s, "
            f"{counters.get('frames_fanned_out', 0) / counters['writes']:.1f} deliveries per "
            f"write; slow consumers cut off: {counters.get('slow_consumers', 0)}"
        )
    print(
        f"machine CPU          : {cpu['machine']:.0f} % of {100 * mp.cpu_count()} % "
        f"(softirq {cpu['softirq']:.0f} %, other processes {cpu['other']:.0f} %)"
    )
    if result["closes"] or result["setup_failures"]:
        print(f"closes / failures    : {result['closes']} {result['setup_failures']}")
    server = result.get("server_log", {})
    if server:
        print(f"server log           : {server['counts'] or 'no warnings'} ({server['log']})")
        for line in server["examples"][:5]:
            print(f"    {line}")
    verdict = "PASS" if result["pass"] else "FAIL"
    print(
        f"result               : {verdict} (all delivered: {result['all_delivered']}, "
        f"p99 {lat['p99']:.1f} ms vs {TARGET_P99_MS:g} ms)"
    )
