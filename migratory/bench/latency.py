"""Latency histograms: 0.1 ms buckets, merged across load processes, read as percentiles.

A load process keeps a dense list of ``BUCKETS`` counts, ships it to the
parent as a sparse dict (pipes pickle it), and the parent merges the dense
forms back and reads the percentiles off the cumulative counts.
"""

from __future__ import annotations

BUCKET_NS = 100_000  # 0.1 ms
BUCKETS = 100_000  # up to 10 s; the last bucket holds everything slower


def percentiles_ms(hist: list[int], qs: tuple[float, ...]) -> dict[str, float]:
    """Upper edges (ms) of the buckets where the cumulative count passes each quantile."""
    total = sum(hist)
    out: dict[str, float] = {}
    if not total:
        return {f"p{q * 100:g}": float("nan") for q in qs}
    targets = sorted((q * total, q) for q in qs)
    cum = 0
    t = 0
    for bucket, n in enumerate(hist):
        if not n:
            continue
        cum += n
        while t < len(targets) and cum >= targets[t][0]:
            out[f"p{targets[t][1] * 100:g}"] = (bucket + 1) * BUCKET_NS / 1e6
            t += 1
        if t == len(targets):
            break
    return out


def merge_hist(hists: list[list[int]]) -> list[int]:
    merged = [0] * BUCKETS
    for hist in hists:
        for i, n in enumerate(hist):
            if n:
                merged[i] += n
    return merged


def sparse(hist: list[int]) -> dict[int, int]:
    return {i: n for i, n in enumerate(hist) if n}


def dense(pairs: dict[int, int]) -> list[int]:
    hist = [0] * BUCKETS
    for i, n in pairs.items():
        hist[i] += n
    return hist
