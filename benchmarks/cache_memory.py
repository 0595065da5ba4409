"""Memory of the message caches: bytes of RSS per cached message, and what
``CacheMemoryBudget`` bounds (migratory/model/cache_budget.py).

Fills a hub (as a member's) or a seed's replicated cache with ``--messages`` messages of
``--size`` bytes round-robin over ``--subjects`` subjects (``MaxCachedMessagesPerSubject``
1000, no expiry within the run), in this process, and reports the RSS it grew by,
per message cached, with the budget's own count beside it::

    .venv/bin/python benchmarks/cache_memory.py --cache hub --budget 0
    .venv/bin/python benchmarks/cache_memory.py --cache hub --budget 268435456
    .venv/bin/python benchmarks/cache_memory.py --cache replicated --budget 268435456

``--guaranteed`` fills a Guaranteed member's hub instead (positions numbered by the
seeds, taken with ``apply``); ``--rate R`` spreads the messages over simulated time at R
per second and runs the server's expiry sweep every simulated second
(``CacheExpireTime`` 180 s), so one-off subjects (``--subjects`` = ``--messages``) come
and go as they would in a day of notifications; the peak of subjects held is reported::

    .venv/bin/python benchmarks/cache_memory.py --guaranteed --messages 1000000 \
        --subjects 1000000 --rate 2000 --budget 268435456

``--fields N`` gives each message N fields of 4-character names and empty values (made
afresh per message, as a decoded publish has them): the many-tiny-fields message whose
str objects a budget counting text lengths missed::

    .venv/bin/python benchmarks/cache_memory.py --cache replicated --messages 400 \
        --subjects 4 --size 0 --fields 20000 --budget 33554432
"""

from __future__ import annotations

import argparse
import gc
import os
import time

from cluster.replicated_cache import ReplicatedCache
from migratory.model.message import Message, Qos
from migratory.server.app import TICK_SECONDS, expire_budget
from migratory.server.hub import Hub

EXPIRE_SECONDS = 180.0  # CacheExpireTime's default
TICKS_PER_SECOND = round(1 / TICK_SECONDS)

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", choices=["hub", "replicated"], default="hub")
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--subjects", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--fields", type=int, default=0,
                        help="fields per message (4-character names, empty values)")
    parser.add_argument("--budget", type=int, default=0, help="CacheMemoryBudget (0: none)")
    parser.add_argument("--guaranteed", action="store_true",
                        help="a Guaranteed member's hub (positions numbered elsewhere)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="messages per simulated second, with the expiry sweep (0: "
                             "all at once, no expiry)")
    args = parser.parse_args()
    subjects = [f"/market/symbol/{i}" for i in range(args.subjects)]
    filler = os.urandom(args.size + 64)

    def content(i: int) -> bytes:  # a bytes object of its own, as a decoded publish has
        return filler[i % 64:i % 64 + args.size]

    def subject(i: int) -> str:  # a str of its own, as a decoded publish has
        return "".join((subjects[i % args.subjects], ""))[:]

    def fields(i: int) -> dict[str, str]:  # names of their own, as a decoder makes them
        return {f"{i % 16:x}{n:03x}": "" for n in range(args.fields)}

    gc.collect()
    gc.freeze()
    base = rss()
    started = time.process_time()
    peak = 0
    if args.cache == "hub":
        hub = Hub(epoch=1 if args.guaranteed else 7, cache_memory_budget=args.budget,
                  numbered_elsewhere=args.guaranteed, cache_expire_seconds=EXPIRE_SECONDS)
        seqs = [0] * args.subjects
        next_sweep = 1.0
        for i in range(args.messages):
            now = i / args.rate if args.rate else 0.0
            if args.rate and now >= next_sweep:
                for _ in range(TICKS_PER_SECOND):  # the server sweeps a slice each tick
                    hub.expire(now, budget=expire_budget(hub.subject_count, EXPIRE_SECONDS))
                peak = max(peak, hub.subject_count)
                next_sweep += 1.0
            if args.guaranteed:
                s = i % args.subjects
                seqs[s] += 1
                hub.apply(Message(subject(i), content(i), fields(i), epoch=7, seq=seqs[s]),
                          now)
            else:
                hub.publish(Message(subject(i), content(i), fields(i)), now)
        peak = max(peak, hub.subject_count)
        stats = hub.statistics()
        cached, counted, evicted = stats.cached_messages, stats.cache_bytes, stats.cache_evicted
    else:
        replicated = ReplicatedCache(1000, args.budget)
        seqs = [0] * args.subjects
        for i in range(args.messages):
            s = i % args.subjects
            seqs[s] += 1
            replicated.append([Message(subject(i), content(i), fields(i), False,
                                       Qos.GUARANTEED, None, 7, seqs[s])])
        budget = replicated.budget
        cached = sum(len(s.cached) for s in replicated.to_sync(
            0, {subject: (7, seqs[i]) for i, subject in enumerate(subjects)}).subjects)
        counted = 0 if budget is None else budget.bytes
        evicted = 0 if budget is None else budget.evicted
    cpu = time.process_time() - started
    grown = rss() - base
    if args.cache == "hub":
        print(f"{'Guaranteed member' if args.guaranteed else 'single server'} hub"
              f"{f', {args.rate:,.0f} messages/s with expiry' if args.rate else ''}: "
              f"peak {peak:,} subjects held, {hub.subject_count:,} at the end "
              f"({hub.forgotten:,} forgotten)")
    with_fields = f" and {args.fields:,} fields" if args.fields else ""
    print(f"{args.cache} cache, budget {args.budget or 'none'}: {args.messages:,} messages of "
          f"{args.size} B{with_fields} over {args.subjects:,} subjects -> {cached:,} cached, "
          f"{evicted:,} "
          f"dropped by the budget; RSS +{grown / 2**20:,.0f} MiB ({grown / max(cached, 1):.0f} "
          f"B per cached message), budget count {counted / 2**20:,.0f} MiB; "
          f"{cpu / args.messages * 1e6:.2f} us of CPU per message")


if __name__ == "__main__":
    main()
