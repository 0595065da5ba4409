"""A seed's Raft dump rewritten for the code before its caches were packed (524f73f).

A seed writes its replicated caches into ``raft.dump`` as one packed ``bytes``
(:mod:`cluster.dump_decoder`). 524f73f, the version before, cannot load such a dump: it
logs ``failed to load full dump`` (``KeyError: 'cached'``) about 25 times a second,
applies nothing and is never ready. So a seed of this version that had written a dump
could not be taken back to 524f73f (docs/cluster.md, "Upgrading and downgrading").

``migratory downgrade-dump DIR`` (the seed stopped, or stopped right after: a dump it
writes later is of this version's format again; ``DIR`` its ``ClusterDataDir``)
rewrites ``DIR/raft.dump`` with each
:class:`~cluster.replicated_cache.ReplicatedCache` pickled as 524f73f pickled it
(:meth:`~cluster.replicated_cache.ReplicatedCache.caches_state`: the caches themselves),
each :class:`~cluster.coordination.Coordinator` too (its numbering, packed since h91:
:meth:`~cluster.coordination.Coordinator.to_state`), the batches a seed held while its
numbering decoded (``held``, ``cluster/raft_consumer.py``: 524f73f knows no such thing)
applied to the state they follow, and everything else as it was; this version loads
that format too. The file is
replaced whole (written beside it, synced, renamed); a dump already of that format is
left as it is. The journal is not touched: both versions read it.
"""

from __future__ import annotations

import argparse
import copyreg
import gzip
import pickle
import sys
from pathlib import Path
from typing import Any

from cluster import raft_unpickler
from cluster.coordination import Coordinator
from cluster.raft_dump_files import DUMP_PROTOCOL
from cluster.raft_durability import durable_replace
from cluster.replicated_cache import ReplicatedCache

__all__ = ["add_command", "downgrade"]


class _OldCaches(pickle.Pickler):
    """Pickles a :class:`ReplicatedCache` and a :class:`Coordinator` as the code before
    did (the caches' state, the numbering's)."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, DUMP_PROTOCOL)
        self.caches = 0

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is Coordinator:
            return copyreg.__newobj__, (Coordinator,), obj.to_state()  # type: ignore[attr-defined]
        if type(obj) is not ReplicatedCache:
            return NotImplemented
        self.caches += 1
        return copyreg.__newobj__, (ReplicatedCache,), obj.caches_state()  # type: ignore[attr-defined]


def downgrade(path: Path) -> int:
    """Rewrite the dump at ``path`` for 524f73f; how many packed caches it held (0: it
    was of that format already, and is left as it is). ``ValueError`` if it does not
    load (:class:`~cluster.dump_decoder.DumpDecodeError`: damaged caches)."""
    with gzip.open(path, "rb") as g:
        data = raft_unpickler.RaftUnpickler(g).load()
    packed, numberings, consumers = _packed(data)
    if not (packed or numberings or consumers):
        return 0
    for cache in packed:
        cache.caches_state()  # decoded here (DumpDecodeError before anything is written)
    for coordinator in numberings:
        coordinator.settle()
    for consumer in consumers:  # the batches held: applied, as the seed would have
        coordinator, cache = consumer["coordinator"], consumer["cache"]
        for epoch_candidate, wire in consumer.pop("held"):
            cache.append(coordinator.apply_wire(epoch_candidate, wire).messages)
    temporary = path.with_name(path.name + ".downgrade.tmp")
    with temporary.open("wb") as f, gzip.GzipFile(fileobj=f, mode="wb") as g:
        pickler = _OldCaches(g)
        pickler.dump(data)
    durable_replace(str(temporary), str(path))
    return len(packed)


def _packed(data: Any) -> tuple[list[ReplicatedCache], list[Coordinator], list[dict[str, Any]]]:
    """What a loaded dump holds that 524f73f cannot load (pysyncobj's dump: a tuple whose
    first item holds each consumer's attributes, a dict): the caches and the numberings
    that came packed, and the consumers' attributes with ``held`` batches."""
    caches: list[ReplicatedCache] = []
    numberings: list[Coordinator] = []
    consumers: list[dict[str, Any]] = []
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, ReplicatedCache):
            if item.decoding:
                caches.append(item)
        elif isinstance(item, Coordinator):
            if item.decoding:
                numberings.append(item)
        elif isinstance(item, (tuple, list)):
            stack.extend(item)
        elif isinstance(item, dict):
            if "held" in item and "coordinator" in item:
                consumers.append(item)
            stack.extend(v for k, v in item.items() if k != "held")
    return caches, numberings, consumers


def _run(args: argparse.Namespace) -> int:
    path = Path(args.data_dir) / "raft.dump"
    if not path.is_file():
        print(f"migratory: {path}: no Raft dump here: nothing to downgrade (524f73f reads "
              "the journal as it is)", file=sys.stderr)
        return 0
    try:
        count = downgrade(path)
    except (OSError, ValueError, pickle.UnpicklingError, EOFError) as exc:
        print(f"migratory: {path}: not downgraded: {exc}", file=sys.stderr)
        return 1
    if count:
        print(f"migratory: {path}: rewritten for 524f73f ({count} cache(s))", file=sys.stderr)
    else:
        print(f"migratory: {path}: already of 524f73f's format: left as it is",
              file=sys.stderr)
    return 0


def add_command(commands: Any) -> None:
    command = commands.add_parser(
        "downgrade-dump",
        help="rewrite a stopped seed's raft.dump for migratory 524f73f (docs/cluster.md)",
    )
    command.add_argument("data_dir", metavar="DIR", help="the seed's ClusterDataDir")
    command.set_defaults(func=_run)
