"""The server of ``benchmarks/soak.py``: ``migratory serve`` with an object census.

    .venv/bin/python benchmarks/soak_probe.py serve --set Key=Value ...

Runs the ``migratory`` command unchanged, after installing a SIGUSR1 handler when
``MIGRATORY_SOAK_CENSUS`` names a path prefix: on the signal the process runs a full
garbage collection and writes to ``PREFIX.PID.json`` (whole, by rename) a JSON map::

    {"census": N, "objects": {type name: count of gc-tracked objects},
     "blocks": the interpreter's allocated blocks after the collection,
     "tracemalloc": [[site, bytes grown since the first census, count grown], ...]}

(the objects the server froze at start-up, ``gc.freeze``, are unfrozen at the first
census, so that they are counted: the probed server's full collections then walk
them again); the last only under ``PYTHONTRACEMALLOC=N`` (Python then traces allocations from the
start; the census compares each snapshot with the first one). A benchmark tool, not
a production API: nothing in the server knows about it.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import tracemalloc
from collections import Counter
from types import FrameType

from cluster.cli import main

_first: list[tracemalloc.Snapshot] = []
_count = [0]


def census() -> dict[str, object]:
    """Objects by type after a full collection (and the traced growth, if tracing).

    ``gc.get_objects()`` may list a tuple another thread is still building (a cluster
    member's Raft thread): if that thread ran while the list holds it, its resize would
    fail (``SystemError``, seen once with a probe in a ``gc.callbacks`` hook,
    docs/benchmarks.md). So no other thread is let run while the list exists: the switch
    interval is raised for the census, and every reference to the objects is dropped
    before it is set back. (The Raft thread waits meanwhile, ~0.1-1 s: a census may cost
    the cluster an election; take it between measurements, as soak.py does.)"""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        out = _objects_census()
    finally:
        sys.setswitchinterval(interval)
    if tracemalloc.is_tracing():
        snapshot = tracemalloc.take_snapshot().filter_traces(
            (tracemalloc.Filter(False, tracemalloc.__file__),)
        )
        if not _first:
            _first.append(snapshot)
        by_line = snapshot.compare_to(_first[0], "lineno")
        out["tracemalloc"] = [
            [str(stat.traceback[0]), stat.size_diff, stat.count_diff] for stat in by_line[:25]
        ]
        out["tracemalloc_total"] = [sum(s.size_diff for s in by_line),
                                    sum(s.count_diff for s in by_line)]
    return out


def _objects_census() -> dict[str, object]:
    """The census proper; its list of every object goes when it returns."""
    gc.unfreeze()  # the server froze what it made at start-up: count that too
    gc.collect()
    objects = gc.get_objects()
    by_type = Counter(type(o).__qualname__ for o in objects)
    _count[0] += 1
    out: dict[str, object] = {"census": _count[0], "objects": dict(by_type),
                              "blocks": sys.getallocatedblocks()}  # after the collection
    wanted = set(filter(None, os.environ.get("MIGRATORY_SOAK_REFERRERS", "").split(",")))
    if wanted:
        out["referrers"] = referrers(objects, wanted)
    hubs = [o for o in objects if type(o).__qualname__ == "Hub"]
    del objects
    out["subjects"] = {
        "/".join(subject.split("/")[:3]): count
        for hub in hubs
        for subject, count in Counter(
            "/".join(s.split("/")[:3]) for s in hub.subject_names()
        ).items()
    }
    return out


def referrers(objects: list[object], wanted: set[str]) -> dict[str, dict[str, int]]:
    """For each type named in ``wanted``: who refers to (up to 500 of) its objects, by
    type, and for dicts and lists, the type of the object holding them."""
    out: dict[str, dict[str, int]] = {}
    for name in wanted:
        found = [o for o in objects if type(o).__qualname__ == name][:500]
        holders: Counter[str] = Counter()
        for obj in found:
            for ref in gc.get_referrers(obj):
                if ref is objects or ref is found:
                    continue
                label = type(ref).__qualname__
                if isinstance(ref, (dict, list, set, tuple)):
                    owners = [type(r).__qualname__ for r in gc.get_referrers(ref)
                              if r is not objects and r is not found][:2]
                    label += " in " + ",".join(owners)
                holders[label] += 1
        out[name] = dict(holders.most_common(8))
        del found
    return out


def census_path(prefix: str, pid: int) -> str:
    return f"{prefix}.{pid}.json"


def _on_signal(_signum: int, _frame: FrameType | None) -> None:
    path = census_path(os.environ["MIGRATORY_SOAK_CENSUS"], os.getpid())
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(census(), f)
    os.replace(tmp, path)


if __name__ == "__main__":
    if os.environ.get("MIGRATORY_SOAK_CENSUS"):
        signal.signal(signal.SIGUSR1, _on_signal)
    sys.exit(main())
