"""A leader's dump reaches a follower whole in one round: its last data chunk is the last;
and a dump cut by a broken link is never spliced together at the follower.

pysyncobj marked only an extra, empty chunk as last; a leader that compacted often
never sent it to a deposed seed, which then never caught up (chaos seed 4, see
``cluster.raft_dump_chunks.mark_the_last_chunk``).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.serializer import Serializer
from raft_schedules import left_behind
from raft_sim import RaftWorld

from cluster.raft_dump_chunks import mark_the_last_chunk
from cluster.raft_follower import FollowerSafeSyncObj

CHUNK = 1000


def leader_serializer(path: Path, marked: bool) -> Serializer:
    serializer = Serializer(str(path), CHUNK, True, None, None, None)
    if marked:
        mark_the_last_chunk(serializer)
    return serializer


def chunks_of_one_round(serializer: Serializer) -> list[tuple[bytes, bool, bool]]:
    """What the leader sends in one round until the transmission says it is last."""
    sent = []
    for _ in range(100):
        data, first, last = serializer.getTransmissionData("follower")
        sent.append((data, first, last))
        if last:
            return sent
    raise AssertionError("the transmission never ended")


@pytest.mark.parametrize("size", [2500, 1000, 1, 3000])
def test_the_chunk_that_ends_the_dump_is_the_last(tmp_path: Path, size: int) -> None:
    dump = tmp_path / "leader.dump"
    dump.write_bytes(os.urandom(size))
    sent = chunks_of_one_round(leader_serializer(dump, marked=True))
    assert b"".join(d for d, _, _ in sent) == dump.read_bytes()
    assert [first for _, first, _ in sent] == [True] + [False] * (len(sent) - 1)
    whole_chunks, rest = divmod(size, CHUNK)
    # an empty closing chunk only when the dump is a whole number of chunks
    assert len(sent) == whole_chunks + 1
    assert sent[-1][0] == (b"" if not rest else dump.read_bytes()[-rest:])


def test_the_follower_installs_it_on_the_last_data_chunk(tmp_path: Path) -> None:
    dump = tmp_path / "leader.dump"
    dump.write_bytes(os.urandom(2500))
    follower = Serializer(str(tmp_path / "follower.dump"), CHUNK, True, None, None, None)
    results = [follower.setTransmissionData(chunk)
               for chunk in chunks_of_one_round(leader_serializer(dump, marked=True))]
    assert results == [False, False, True]  # three data chunks, the third completes it
    assert (tmp_path / "follower.dump").read_bytes() == dump.read_bytes()


def test_pysyncobj_alone_needs_an_extra_empty_chunk(tmp_path: Path) -> None:
    """The behaviour the patch changes (if pysyncobj changes it, this shows it)."""
    dump = tmp_path / "leader.dump"
    dump.write_bytes(os.urandom(2500))
    sent = chunks_of_one_round(leader_serializer(dump, marked=False))
    assert [len(d) for d, _, _ in sent] == [1000, 1000, 500, 0]


def test_a_transmission_cut_short_by_a_new_dump_starts_again_whole(tmp_path: Path) -> None:
    dump = tmp_path / "leader.dump"
    dump.write_bytes(os.urandom(2500))
    leader = leader_serializer(dump, marked=True)
    first = leader.getTransmissionData("follower")
    assert first is not None and first[1] and not first[2]
    leader._Serializer__transmissions = {}  # what pysyncobj does when a dump is written
    again = chunks_of_one_round(leader)
    assert again[0][1] and b"".join(d for d, _, _ in again) == dump.read_bytes()


class SplicesDumpParts(FollowerSafeSyncObj):
    """pysyncobj's follower: any part that is not a first one is appended."""

    def _part_of_the_dump_begun(self, node: Any, message: dict[str, Any]) -> bool:
        return True


def dump_cut_by_a_reset(node_class: type[Any]) -> RaftWorld:
    """C is cut off while 30 entries of 200 random bytes commit (compaction every 6), so
    it needs the leader's dump: ~40 parts of 64 B go out in one round, 3 arrive, then the
    link breaks and is made again before the leader's next round (the rest is lost)."""
    world = RaftWorld(3, node_class=node_class, seed=3, compaction_entries=6,
                      dump_part_bytes=64, send_seconds=0.001)
    leader, c = left_behind(world, entries=30, size=200, seed=1)
    world.clock.now += 0.05
    world.tick(leader)
    assert world.dump_parts_sent > 10
    world.deliver(leader, c, 3)
    world.reset(leader, c)
    for _ in range(20):
        world.step(0.05)
    return world


def test_a_dump_cut_by_a_broken_link_is_sent_again_from_its_start() -> None:
    """The leader keeps its place in the transmission across the reset; the follower
    drops the parts that do not continue what it received and takes the next whole
    dump. Before the fix: "failed to load full dump" (the parts lost in flight were
    spliced out)."""
    world = dump_cut_by_a_reset(FollowerSafeSyncObj)
    try:
        assert world.violations() == []
        assert world.dumps_installed >= 1
        assert world.converged()
    finally:
        world.close()


def test_pysyncobj_s_follower_splices_the_parts() -> None:
    world = dump_cut_by_a_reset(SplicesDumpParts)
    try:
        assert "logged: failed to load full dump" in world.violations()
    finally:
        world.close()


def test_a_dump_that_fails_to_load_vouches_for_nothing() -> None:
    """A deposed leader holds 3 commands of its own term nobody else has; the others
    commit 30 and compact, so it needs the new leader's dump -- whose first load fails
    (as on a read error). pysyncobj logs and carries on; the follower must not answer
    success nor move its commit index over its own tail. Before the fix it committed
    the 3 at 3..5, over entries committed there ("committed 1:... at 3, 2:... was
    committed there")."""
    rnd = random.Random(1)
    world = RaftWorld(3, seed=3, compaction_entries=6, dump_part_bytes=64, send_seconds=0.001)
    try:
        for _ in range(20):
            world.step(0.05)
        deposed = world.leader()
        assert deposed is not None
        for other in world.addresses:
            world.cut(deposed, other)
        for i in range(3):
            world.submit(deposed, b"tail%d" % i)
        world.tick(deposed)
        for _ in range(40):
            world.step(0.05)
            leader = world.leader()
            if leader is not None and leader != deposed:
                break
        assert leader is not None and leader != deposed
        for i in range(30):
            world.submit(leader, b"v%03d" % i + rnd.randbytes(100))
            world.step(0.05)
        serializer = world.nodes[deposed]._SyncObj__serializer
        read, failures = serializer.deserialize, [1]

        def fails_once() -> Any:
            if failures.pop() if failures else False:
                raise OSError("simulated: the dump could not be read")
            return read()

        serializer.deserialize = fails_once
        world.heal_all()
        for _ in range(40):
            world.step(0.05)
        assert not failures, "the failure happened"
        assert world.violations() == ["logged: failed to load full dump"]
        assert world.converged()
    finally:
        world.close()


def test_a_part_from_a_leader_that_leads_again_is_not_spliced_in() -> None:
    """X sent the first parts of its dump, then Y (a later term) began its own; X, leading
    again in a third term, resumes its old transmission (pysyncobj keeps it) with a part
    that is not a first one: dropped, as is a part from X after its link broke."""
    world = RaftWorld(3, seed=3)
    try:
        follower, x, y = world.addresses
        node = world.nodes[follower]
        peers = node._SyncObj__transport.peers

        def part(sender: str, term: int, first: bool) -> bool:
            message = {"type": "append_entries", "term": term, "commit_index": 0,
                       "serialized": (b"part", first, False)}
            return bool(node._part_of_the_dump_begun(peers[sender], message))

        assert part(x, 2, True) and part(x, 2, False)
        assert part(y, 3, True) and part(y, 3, False)
        assert not part(x, 4, False), "X's old transmission, Y's file"
        assert part(x, 4, True) and part(x, 4, False)
        world.reset(follower, x)
        assert not part(x, 4, False), "the parts in flight were lost"
    finally:
        world.close()


def test_a_dump_loaded_is_answered_at_once() -> None:
    """The follower's note of the dump it read (``_last_dump_entry``) was set after
    SyncObj.__init__, so every dump carried the leader's (None) over it: each dump
    loaded looked not loaded ("could not be loaded: asking for it again"), and was
    answered only by the next AppendEntries."""
    world = RaftWorld(3, seed=3, compaction_entries=6, dump_part_bytes=256, send_seconds=0.004)
    try:
        left_behind(world, entries=30, size=100, seed=5)
        for _ in range(60):
            world.step(0.05)
        assert world.dumps_installed >= 1
        assert not [r for r in world.logs.records if "could not be loaded" in r.getMessage()]
        assert world.violations() == [] and world.converged()
    finally:
        world.close()
