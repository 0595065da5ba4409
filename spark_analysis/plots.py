"""PNG plots (matplotlib, Agg backend): latency and throughput over time, faults shaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _shade(ax: Any, windows: list[dict[str, Any]]) -> None:
    for i, w in enumerate(windows):
        ax.axvspan(
            w["start"],
            max(w["end"], w["start"] + 0.2),
            color="tab:red",
            alpha=0.12,
            label="fault window" if i == 0 else None,
        )


def latency_plot(path: Path, lat: dict[str, Any], windows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    buckets = [b for b in lat["buckets"] if b["count"]]
    xs = [b["start"] + lat["bucket_seconds"] / 2 for b in buckets]
    for key, style in (("p50_ms", "-"), ("p90_ms", "--"), ("p99_ms", ":"), ("max_ms", "-.")):
        ax.plot(xs, [b[key] for b in buckets], style, marker=".", label=key.replace("_ms", ""))
    _shade(ax, windows)
    ax.set_xlabel("run time (s)")
    ax.set_ylabel("latency (ms)")
    if buckets and max(b["max_ms"] or 0 for b in buckets) > 50 * max(
        b["p50_ms"] or 0.001 for b in buckets
    ):
        ax.set_yscale("log")
    ax.set_title(f"sdk delivery latency per {lat['bucket_seconds']:g} s bucket")
    ax.legend(loc="upper right", fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def throughput_plot(
    path: Path, series: dict[str, list[tuple[float, int]]], windows: list[dict[str, Any]]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    for name, points in series.items():
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], label=f"{name}/s", lw=1)
    _shade(ax, windows)
    ax.set_xlabel("run time (s)")
    ax.set_ylabel("per second")
    ax.set_title("throughput")
    ax.legend(loc="upper right", fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
