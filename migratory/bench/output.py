"""A bench run's results: one table row per target, the JSON file, the latency plot.

Every pattern's result carries ``latency_ms`` (percentiles of the latency it
measures: publish -> receive, or publish -> acknowledgement) and ``hist`` (the
0.1 ms histogram, sparse) so the same table and plot serve every pattern.
The plot needs matplotlib (the optional ``bench`` extra).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from migratory.bench.latency import BUCKET_NS

COLUMNS = ("target", "pattern", "pub/sub", "rate", "counted", "p50", "p99", "p99.9", "max",
           "loop stall", "server CPU")


def _ms(value: float | None) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else (
        f"{value:.1f}"
    )


def row(result: dict[str, Any]) -> list[str]:
    """One table row: what was sent, what was counted, latency in ms."""
    lat = result.get("latency_ms") or {}
    figures = result.get("cpu_percent") or {}
    # the server's processes: one, or a supervisor and its workers (docs/workers.md)
    cpu = sum(v for k, v in figures.items() if k.startswith("server")) if "server" in figures \
        else None
    if result["pattern"] == "idle-connections":
        counted = f"{result['opened']}/{result['connections']} open"
        kib = result.get("kib_per_connection")
        rate = "RSS not measured" if kib is None else f"{kib:.2f} KiB/conn"
    else:
        counted = f"{result['counted']:,}/{result['expected']:,}"
        rate = f"{result.get('messages_per_second', 0):,.0f} msg/s"
    protocols = ("native" if result["pattern"] == "idle-connections" else
                 f"{result.get('publisher', '?')}/{result.get('front_end', '?')}")
    if result["pattern"] == "publish-with-ack":
        protocols = result.get("publisher", "?")
    return [
        result.get("target", {}).get("name", "?"),
        result["pattern"],
        protocols,
        rate,
        counted,
        _ms(lat.get("p50")),
        _ms(lat.get("p99")),
        _ms(lat.get("p99.9")),
        _ms(lat.get("max")),
        _ms(result.get("loop_gap_max_ms")),  # the server's longest event-loop gap (/stats)
        "-" if cpu is None else f"{cpu:.0f} %",
    ]


def table(results: Sequence[dict[str, Any]]) -> str:
    """The results as a plain-text table (latencies in ms)."""
    rows = [list(COLUMNS), *(row(r) for r in results)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.rjust(w) if i >= 3 else cell.ljust(w)
                       for i, (cell, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n(latencies and the server's longest loop stall in ms)"


def without_nan(value: Any) -> Any:
    """``value`` with every NaN (a figure that has no value, e.g. no acks) as None."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: without_nan(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [without_nan(v) for v in value]
    return value


def write_json(path: str, results: Sequence[dict[str, Any]]) -> None:
    """Strict JSON (no NaN: a figure without a value is null)."""
    with open(path, "w") as f:
        json.dump({"schema": 1, "results": without_nan(list(results))}, f, indent=2,
                  sort_keys=True, allow_nan=False)


def write_plot(path: str, results: Sequence[dict[str, Any]]) -> None:
    """Latency distribution of every result with a histogram: percentile curve (log scale).

    Raises RuntimeError when matplotlib is missing (``pip install 'migratory[bench]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError(
            "--plot needs matplotlib: pip install 'migratory[bench]'"
        ) from None
    fig, ax = plt.subplots(figsize=(8, 5))
    drawn = 0
    for result in results:
        hist = {int(k): v for k, v in (result.get("hist") or {}).items()}
        total = sum(hist.values())
        if not total:
            continue
        xs, ys, cum = [], [], 0
        for bucket in sorted(hist):
            cum += hist[bucket]
            share = min(cum / total, 1 - 0.5 / total)
            xs.append(1 / (1 - share))  # 1, 10, 100, 1000 = p0, p90, p99, p99.9
            ys.append((bucket + 1) * BUCKET_NS / 1e6)
        label = f"{result.get('target', {}).get('name', '?')} {result['pattern']}"
        ax.step(xs, ys, where="post", label=label)
        drawn += 1
    ax.set_xscale("log")
    ax.set_xticks([1, 2, 10, 100, 1000, 10000])
    ax.minorticks_off()
    ax.set_xticklabels(["p0", "p50", "p90", "p99", "p99.9", "p99.99"])
    ax.set_ylabel("latency (ms)")
    ax.set_title("migratory bench: latency distribution")
    ax.grid(True, which="both", alpha=0.3)
    if drawn:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
