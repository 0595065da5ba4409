"""EXPERIMENT ONLY: a cluster member with suggested hot-path changes monkeypatched in.

Used by ``cluster_throughput.py --patched`` to estimate what the changes
suggested in docs/benchmarks.md ("Why throughput misses 20,000/s") would
buy, without editing ``migratory/`` or ``cluster/``:

1. ``Coordinator._number``: build the numbered ``Message`` directly instead of
   ``dataclasses.replace`` (one constructor call, no field introspection).
2. ``Hub.apply`` / ``Hub.publish``: ``replace`` returns the message itself when
   it already has the requested values (committed messages already are
   UPDATE without closure).

3. (``switch`` in CLUSTER_BENCH_PATCHES) ``sys.setswitchinterval(0.0005)``: the
   trio thread and the pysyncobj thread share the GIL; the default 5 ms switch
   interval can delay the other thread by up to 5 ms per hand-over.

CLUSTER_BENCH_PATCHES (comma-separated, default ``replace``) picks them:
``replace`` = 1 and 2, ``switch`` = 3.
Run as ``python benchmarks/cluster_patched_member.py serve --set ...``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cluster.coordination as coordination
import migratory.server.hub as hub
from cluster.cli import main
from migratory.model.message import Message

_replace = dataclasses.replace


def numbered_replace(obj, **kw):  # type: ignore[no-untyped-def]
    if type(obj) is Message:
        return Message(
            obj.subject, obj.content, obj.fields, obj.retained, obj.qos,
            kw.get("closure", obj.closure), kw.get("epoch", obj.epoch),
            kw.get("seq", obj.seq), kw.get("type", obj.type),
        )
    return _replace(obj, **kw)


def lazy_replace(obj, **kw):  # type: ignore[no-untyped-def]
    for key, value in kw.items():
        if getattr(obj, key) is not value:
            return _replace(obj, **kw)
    return obj


PATCHES = set(os.environ.get("CLUSTER_BENCH_PATCHES", "replace").split(","))
if "replace" in PATCHES:
    coordination.replace = numbered_replace  # type: ignore[attr-defined]
    hub.replace = lazy_replace  # type: ignore[attr-defined]
if "switch" in PATCHES:
    sys.setswitchinterval(0.0005)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
