"""A message pattern's result: the load processes' figures merged, judged and printed."""

from __future__ import annotations

import argparse
import multiprocessing as mp
from collections import Counter
from typing import Any

from migratory.bench.latency import dense, merge_hist, percentiles_ms
from migratory.bench.stamp import expected_for

QUANTILES = (0.5, 0.9, 0.99, 0.999)
TARGET_P99_MS = 50.0


def cpu_per_delivery(cpu: dict[str, float], counters: dict[str, int]) -> float | None:
    """Server CPU microseconds per delivery over the publishing window (the server's CPU
    seconds / its deliveries): unlike latency, it holds on a busy machine."""
    fanned = counters.get("frames_fanned_out", 0)
    server = sum(v for k, v in cpu.items() if k.startswith("server"))
    if not fanned or not server:
        return None
    return server / 100 * cpu["wall_seconds"] * 1e6 / fanned


def load_cpu_per_delivery(cpu: dict[str, float], received: int) -> float | None:
    """The subscriber processes' CPU microseconds per delivery they counted (their CPU
    seconds over the publishing window / deliveries): what the load generator spends on
    its side of each delivery (``recv``, TLS decryption, counting), on the same cores
    as the server when the server is local."""
    subscribers = sum(v for k, v in cpu.items() if k.startswith("subscribers"))
    if not received or not subscribers or "wall_seconds" not in cpu:
        return None
    return subscribers / 100 * cpu["wall_seconds"] * 1e6 / received


def summarise(args: argparse.Namespace, figures: dict[str, Any]) -> dict[str, Any]:
    """Merge the load processes' histograms and counts into the figures we report.

    ``latency_ms`` and ``hist`` are publish -> receive latencies; with no
    subscribers (the publish-with-ack pattern) they are the acknowledgements'.
    """
    published, results, cpu = figures["published"], figures["results"], figures["cpu"]
    subscribed = figures["subscribed"]
    received = sum(r["received"] for r in results)
    subjects = args.subjects
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
    if args.subscribers:
        hist = merge_hist([dense(r["hist"]) for r in results])
        latency = percentiles_ms(hist, QUANTILES)
        top = max((r["max_ns"] for r in results), default=0) / 1e6
        latency = {k: min(v, top) for k, v in latency.items()}  # a bucket's upper edge
        latency["max"] = top
        sparse_hist = {i: n for i, n in enumerate(hist) if n}
        counted, expected_count = received, expected
        all_counted = received == expected and short == 0 and subscribed == args.subscribers
    else:  # publish-with-ack: every publish must be acknowledged
        latency = dict(published["ack_ms"])
        sparse_hist = published["ack_hist"]
        counted, expected_count = published["acks"], published["sent"]
        all_counted = counted == expected_count and published["unanswered"] == 0
    gaps = loop_gap_in_window(figures["stats_after"], figures.get("window", (0.0, 0.0)))
    load_cpu = sum(v for k, v in cpu.items() if k.startswith(("subscribers", "publisher")))
    target_p99 = getattr(args, "target_p99", TARGET_P99_MS)
    passed = all_counted and (target_p99 is None or latency["p99"] <= target_p99)
    before, after = figures["stats_before"], figures["stats_after"]
    server_counters = {
        key: after[key] - before.get(key, 0)
        for key in ("writes", "bytes_written", "frames_fanned_out", "slow_consumers")
        if key in after
    }
    # from the first send to one period after the last: ``sent`` periods
    seconds = max(published["seconds"] + 1 / args.rate, 1e-9)
    return {
        "benchmark": "fanout",
        "pattern": args.pattern,
        "front_end": args.front_end,
        "publisher": args.publisher,
        "settings": args.set,
        "subscribers": args.subscribers,
        "subjects": subjects,
        "loop_gap_max_ms": gaps,
        "subscribed": subscribed,
        "rate": args.rate,
        "size": args.size,
        "duration": args.duration,
        "procs": args.procs,
        "swarm": getattr(args, "swarm", None),
        "setup_seconds": figures["setup_seconds"],
        "setup_failures": figures["setup_failures"],
        "published": published,
        "messages_per_second": published["sent"] / seconds,
        "counted": counted,
        "expected": expected_count,
        "deliveries_expected": expected,
        "deliveries_received": received,
        "deliveries_per_second": received / seconds,
        "subscribers_short": short,
        "subscribers_extra": extra,
        "subscriber_counts_off": {str(k): v for k, v in sorted(per_conn.items()) if k != 0},
        "closes": dict(closes),
        "latency_ms": latency,
        "latency_of": "publish -> receive" if args.subscribers else "publish -> acknowledgement",
        "hist": sparse_hist,
        "cpu_percent": cpu,
        "load_generator_cpu_percent": load_cpu,
        "subscriber_recvs": sum(r["recvs"] for r in results),
        "subscriber_polls": sum(r["polls"] for r in results),
        "server_rss_kib": {"before": figures["rss_before"], "after": figures["rss_after"]},
        "server_counters": server_counters,
        "server_cpu_us_per_delivery": cpu_per_delivery(cpu, server_counters),
        "load_cpu_us_per_delivery": load_cpu_per_delivery(cpu, received),
        "all_delivered": all_counted,
        "target_p99_ms": target_p99,
        "pass": passed,
    }


def loop_gap_in_window(stats: dict[str, Any], window: tuple[float, float]) -> float | None:
    """The server's largest event-loop gap (ms) in the publishing window (its /stats keep
    the largest gap of each monotonic second, migratory/server/loop_gaps.py).

    Only the seconds wholly inside the window count: the second the window opens in also
    holds the end of the set-up (10,000 subscribers' handshakes stopped the loop 107 ms
    0.9 s before a 25,000 msg/s run whose slowest delivery took 16 ms, and the report
    said 107), and the one it closes in holds what follows. A window without a whole
    second inside counts every second it touches.
    """
    per_second = (stats.get("loop_gaps") or {}).get("per_second") or []
    start, end = window
    first, last = int(start) + 1, int(end) - 1
    if last < first:
        first, last = int(start), int(end)
    inside = [gap for second, gap in per_second if first <= second <= last]
    return max(inside) if inside else None


def report(result: dict[str, Any]) -> None:
    lat = result["latency_ms"]
    pub = result["published"]
    cpu = result["cpu_percent"]
    print()
    print(f"settings             : {' '.join(result['settings']) or '(defaults)'}")
    print(
        f"published            : {pub['sent']} in {pub['seconds']:.2f} s "
        f"(schedule lateness mean {pub['late_mean_ms']:.2f} ms, max {pub['late_max_ms']:.2f} ms)"
    )
    if result["subscribers"]:
        print(
            f"deliveries           : {result['deliveries_received']} / "
            f"{result['deliveries_expected']} expected "
            f"({result['deliveries_per_second']:,.0f}/s); "
            f"{result['subscribers_short']} subscribers short, "
            f"{result['subscribers_extra']} over"
        )
    print(
        f"latency ms ({result['latency_of']}): "
        + ", ".join(f"{k} {v:.1f}" for k, v in lat.items())
    )
    gap = result.get("loop_gap_max_ms")
    print(
        "longest loop stall   : "
        + ("not reported by the server" if gap is None else f"{gap:.1f} ms")
        + f" ({result.get('subjects', 1)} subject(s), {result['subscribers']} subscribers)"
    )
    if pub["acks"]:
        print(
            "publish ack ms       : "
            + ", ".join(f"{k} {v:.1f}" for k, v in pub["ack_ms"].items())
            + f" ({pub['acks']} acks, {pub['unanswered']} unanswered)"
        )
    print(f"publish statuses     : {pub['statuses']}")
    if "server" in cpu:
        workers = {k[7:]: v for k, v in cpu.items() if k.startswith("server-worker")}
        print(
            f"server CPU           : {sum(v for k, v in cpu.items() if k.startswith('server')):.0f}"
            " %" + (f" (supervisor {cpu['server']:.0f}, "
                    + ", ".join(f"{k} {v:.0f}" for k, v in workers.items()) + ")"
                    if workers else "")
            + f"  (RSS {result['server_rss_kib']['before']} -> "
            f"{result['server_rss_kib']['after']} KiB)"
        )
    else:
        print("server CPU           : not measured (its process is not on this machine)")
    print(
        f"load generator CPU   : {result['load_generator_cpu_percent']:.0f} % "
        + (f"({result['swarm']} swarm) " if result.get("swarm") else "")
        + "("
        + ", ".join(
            f"{k} {v:.0f}" for k, v in cpu.items() if k.startswith(("subscribers", "publisher"))
        )
        + ")"
    )
    per_delivery = result.get("server_cpu_us_per_delivery")
    if per_delivery is not None:
        load = result.get("load_cpu_us_per_delivery")
        swarm = result.get("swarm")
        print(f"server CPU/delivery  : {per_delivery:.2f} us"
              + ("" if load is None else f" (subscriber processes: {load:.2f} us"
                 + (f", {swarm} swarm)" if swarm else ")")))
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
    target = result["target_p99_ms"]
    print(
        f"result               : {verdict} (every message counted: {result['all_delivered']}"
        + (f", p99 {lat['p99']:.1f} ms vs {target:g} ms)" if target is not None else ")")
    )
