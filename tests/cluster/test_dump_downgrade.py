"""A seed's Raft dump rewritten for 524f73f (cluster/dump_downgrade.py).

524f73f cannot load the dumps this version writes (their caches packed); rewritten,
every ReplicatedCache in the dump holds its state as 524f73f's own dumps hold it --
compared with the dump 524f73f wrote in ``upgrade_fixture/seeds-524f73f.tar.gz`` -- and
everything else is as it was. Checked by hand with 524f73f itself: docs/cluster.md,
"Upgrading and downgrading".
"""

from __future__ import annotations

import gzip
import io
import pickle
import tarfile
from pathlib import Path
from typing import Any

import pytest
from test_raft_dump_protocol import BEFORE_LAST, LAST, seed_state

from cluster import raft_dump_files, raft_unpickler
from cluster.cli import main
from cluster.dump_downgrade import downgrade
from cluster.raft import CoordinationConsumer
from cluster.replicated_cache import ReplicatedCache

FIXTURE = Path(__file__).resolve().parent / "upgrade_fixture" / "seeds-524f73f.tar.gz"
POSITIONS = {f"/s/{n}": (11, 300 // 7) for n in range(7)}


class _Recorded:
    """Stands for a ReplicatedCache: keeps the state it was pickled with."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.state = state


class _CacheStates(raft_unpickler.RaftUnpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("cluster.replicated_cache", "ReplicatedCache"):
            return _Recorded
        return super().find_class(module, name)


def cache_state(dump: bytes) -> dict[str, Any]:
    """The state the dump's one ReplicatedCache is pickled with."""
    found: list[dict[str, Any]] = []
    stack: list[Any] = [_CacheStates(io.BytesIO(gzip.decompress(dump))).load()]
    while stack:
        item = stack.pop()
        if isinstance(item, _Recorded):
            found.append(item.state)
        elif isinstance(item, (tuple, list)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    (state,) = found
    return state


def old_dump() -> bytes:
    with tarfile.open(FIXTURE) as archive:
        member = archive.extractfile("migratory-0/raft.dump")
        assert member is not None
        return member.read()


def written(path: Path, consumer: CoordinationConsumer) -> Any:
    data = (({}, consumer._serialize()), LAST, BEFORE_LAST, [])
    assert raft_dump_files.write_dump(str(path), data) == 0
    return data


def test_a_dump_of_today_rewritten_holds_its_caches_as_524f73f_dumps_hold_them(
    tmp_path: Path,
) -> None:
    seed = seed_state(300)
    path = tmp_path / "raft.dump"
    written(path, seed)
    assert "packed" in cache_state(path.read_bytes())  # what 524f73f cannot load
    assert downgrade(path) == 1
    state = cache_state(path.read_bytes())
    assert set(state) == set(cache_state(old_dump()))  # the keys 524f73f writes (and reads)
    assert state == seed.cache.caches_state()
    # everything else as it was, and this version loads it back whole
    with gzip.open(path, "rb") as g:
        (_, loaded), last, before_last, _ = raft_unpickler.load(g)
    assert (last, before_last) == (LAST, BEFORE_LAST)
    assert loaded["coordinator"].digest() == seed.coordinator.digest()
    cache: ReplicatedCache = loaded["cache"]
    assert not cache.decoding  # (the format before: loaded at once)
    assert cache.to_sync(6, POSITIONS) == seed.cache.to_sync(6, POSITIONS)


def test_a_dump_of_524f73f_is_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "raft.dump"
    path.write_bytes(old_dump())
    assert downgrade(path) == 0
    assert path.read_bytes() == old_dump()


def test_the_command_says_what_it_did(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["downgrade-dump", str(tmp_path)]) == 0
    assert "no Raft dump here" in capsys.readouterr().err
    written(tmp_path / "raft.dump", seed_state(30))
    assert main(["downgrade-dump", str(tmp_path)]) == 0
    assert "rewritten for 524f73f (1 cache(s))" in capsys.readouterr().err
    assert main(["downgrade-dump", str(tmp_path)]) == 0
    assert "already of 524f73f's format" in capsys.readouterr().err
    (tmp_path / "raft.dump").write_bytes(b"not a dump")
    assert main(["downgrade-dump", str(tmp_path)]) == 1
    assert "not downgraded" in capsys.readouterr().err
    assert (tmp_path / "raft.dump").read_bytes() == b"not a dump"


class _Numbering:
    """Stands for a Coordinator: keeps the state it was pickled with."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.state = state


class _States(_CacheStates):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("cluster.coordination", "Coordinator"):
            return _Numbering
        return super().find_class(module, name)


def consumer_state(dump: bytes) -> dict[str, Any]:
    """The attributes the dump's consumer is pickled with (its coordinator recorded)."""
    (_, consumer), _, _, _ = _States(io.BytesIO(gzip.decompress(dump))).load()
    assert isinstance(consumer, dict)
    return consumer


def test_a_dump_with_its_numbering_packed_and_batches_held_is_rewritten_whole(
    tmp_path: Path,
) -> None:
    """Since h91 the numbering is packed too, and a seed whose numbering was decoding
    holds the batches committed meanwhile (cluster/raft_consumer.py): rewritten, the
    numbering is 524f73f's (its five attributes) with those batches applied, and no
    ``held`` is left for 524f73f to keep as an unknown attribute (and lose)."""
    seed = seed_state(300)
    loaded_state = raft_unpickler.loads(pickle.dumps(seed._serialize(), 4))
    holding = CoordinationConsumer(lambda batch: None, cache_budget=10**8)
    holding._deserialize(loaded_state)  # its numbering decoding: batches are held
    wires = [[("o#9", 1000 + 3 * n + i, f"/s/{i}", b"h%d" % n, {}, False, True)
              for i in range(3)] for n in range(4)]
    for wire in wires:
        holding.commit_batch(11, wire, _doApply=True)
    for wire in wires:
        seed.commit_batch(11, wire, _doApply=True)
    path = tmp_path / "raft.dump"
    written(path, holding)
    state = consumer_state(path.read_bytes())
    assert state["held"] and "numbering" in state["coordinator"].state  # (as written)
    assert downgrade(path) == 1
    state = consumer_state(path.read_bytes())
    old = consumer_state(old_dump())
    assert set(state) == set(old) == {"coordinator", "cache"}  # before: "held" too
    assert set(state["coordinator"].state) == set(old["coordinator"].state)  # before: packed
    assert state["coordinator"].state == seed.coordinator.to_state()
    assert cache_state(path.read_bytes()) == seed.cache.caches_state()
