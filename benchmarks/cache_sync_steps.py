"""CPU time of each step a member taking a whole cache sync runs without yielding to its
event loop, in this process (thread CPU time: the machine may be busy).

Fills a hub with ``--messages`` cached messages of ``--size`` bytes over ``--subjects``
subjects, encodes its sync as the link sends it (parts of ~1 MiB), then, as the taker
does, with the server's garbage-collector settings (start-up frozen, thresholds
20000,2,200): decodes each part, adds it to the assembly (cluster/link_sync.py), and
installs the sync a slice at a time (cluster/cache_sync.py ``SyncInstall``). The longest
of each is how long the taker's loop stops at most for that step; the install at once
(``install_sync``, what the taker did before) is reported beside it. ``--held N``: the
taker already holds N subjects the sync lacks, which it makes unnumbered (a member
re-syncing)::

    .venv/bin/python benchmarks/cache_sync_steps.py --messages 550000 --subjects 10000
    .venv/bin/python benchmarks/cache_sync_steps.py --messages 10000 --subjects 10000 \
        --held 400000
"""

from __future__ import annotations

import argparse
import gc
import json
import time

from cluster.cache_sync import SyncInstall, export_sync, install_sync
from cluster.coordination import UNNUMBERED_EPOCH
from cluster.link_ops import SyncPart, decode_op
from cluster.link_sync import SyncAssembly, sync_frames
from migratory.model.message import Message
from migratory.server.hub import Hub

BUDGET = 256 << 20


def figures(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {"max_ms": round(ordered[-1] * 1e3, 1),
            "median_ms": round(ordered[len(ordered) // 2] * 1e3, 1),
            "total_s": round(sum(ordered), 3), "count": len(ordered)}


def new_taker(held: int, content: bytes) -> Hub:
    """A member's hub; ``held``: subjects of its own the sync lacks (it is re-syncing)."""
    taker = Hub(epoch=UNNUMBERED_EPOCH, numbered_elsewhere=True, cache_memory_budget=BUDGET)
    for i in range(held):
        taker.apply(Message(f"/held/s{i}", content, {}, epoch=4, seq=1), 0.0)
    return taker


def run(args: argparse.Namespace) -> dict[str, object]:
    giver = Hub(epoch=5, cache_memory_budget=BUDGET)
    content = b"x" * args.size
    for i in range(args.messages):
        giver.publish(Message(f"/bench/s{i % args.subjects}", content, {}), 0.0)
    frames = sync_frames(export_sync(giver, 1))
    del giver
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 2, 200)
    cpu = time.thread_time
    assembly, decoding, adding = SyncAssembly(), [], []
    whole = None
    for frame in frames:
        started = cpu()
        op = decode_op(frame[4:])
        decoding.append(cpu() - started)
        assert isinstance(op, SyncPart)
        started = cpu()
        whole = assembly.add(op)
        adding.append(cpu() - started)
    assert whole is not None
    taker = new_taker(args.held, content)
    install, slices, done = SyncInstall(taker, whole.subjects, whole.clsn), [], False
    while not done:
        started = cpu()
        done = install.step(1.0)
        slices.append(cpu() - started)
    again = new_taker(args.held, content)
    started = cpu()
    install_sync(again, whole.subjects, 1.0)
    at_once = cpu() - started
    return {
        "messages": args.messages, "subjects": args.subjects, "held": args.held,
        "parts": len(frames),
        "decode_a_part": figures(decoding), "assembly_add": figures(adding),
        "install_slices": figures(slices), "install_at_once_s": round(at_once, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=550_000)
    parser.add_argument("--subjects", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--held", type=int, default=0,
                        help="subjects the taker holds that the sync lacks (a member re-syncing)")
    print(json.dumps(run(parser.parse_args()), indent=2))


if __name__ == "__main__":
    main()
