#!/usr/bin/env python3
"""CPU per message of the link path between workers and their sequencer, in process.

With ``Workers = N`` every publish crosses the local cluster link twice (docs/workers.md):
the worker that took it encodes a ``Forward``, the sequencer decodes it, numbers it
(``Coordinator.apply_batch``) and encodes the ``Batch``, and every worker decodes that
``Batch``. This times each step (``time.process_time``, no sockets, no hub), per message,
best of ``--rounds``: a figure that holds on a busy machine.

    .venv/bin/python benchmarks/link_path_cpu.py [--batches 2000] [--per-frame 32]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.coordination import Coordinator, PublishRequest
from cluster.link_ops import _HEADER, Batch, Forward, decode_op, encode_frame
from migratory.model.message import Message

STEPS = ("forward encode", "forward decode", "numbering", "batch encode", "batch decode")


def run(batches: int, per_frame: int, rounds: int, subjects: int) -> dict[str, float]:
    coordinator = Coordinator()
    frames = [
        tuple(
            PublishRequest("worker-0", i * per_frame + j,
                           Message(f"/bench/s/{(i * per_frame + j) % subjects}", b"x" * 100))
            for j in range(per_frame)
        )
        for i in range(batches)
    ]
    clock = time.process_time
    best = dict.fromkeys(STEPS, float("inf"))
    for _ in range(rounds):
        spent = dict.fromkeys(STEPS, 0.0)
        for requests in frames:
            a = clock()
            forward = encode_frame(Forward(requests))
            b = clock()
            taken = decode_op(forward[_HEADER:])
            c = clock()
            assert isinstance(taken, Forward)
            batch = coordinator.apply_batch(7, taken.requests)
            d = clock()
            encoded = encode_frame(Batch(batch))
            e = clock()
            decode_op(encoded[_HEADER:])
            f = clock()
            for step, seconds in zip(STEPS, (b - a, c - b, d - c, e - d, f - e), strict=True):
                spent[step] += seconds
        messages = batches * per_frame
        for step in STEPS:
            best[step] = min(best[step], spent[step] / messages * 1e6)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--per-frame", type=int, default=32, help="publishes per frame")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--subjects", type=int, default=10_000)
    args = parser.parse_args()
    best = run(args.batches, args.per_frame, args.rounds, args.subjects)
    print(f"us CPU per message, best of {args.rounds} ({args.per_frame} per frame):")
    for step, us in best.items():
        print(f"  {step:15} {us:5.2f}")
    print(f"  {'total':15} {sum(best.values()):5.2f}  (a message is decoded from a Batch "
          "once per worker: add one 'batch decode' per worker beyond the first)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
