"""A leader's dump reaches a follower whole in one round: its last data chunk is the last.

pysyncobj marked only an extra, empty chunk as last; a leader that compacted often
never sent it to a deposed seed, which then never caught up (chaos seed 4, see
``cluster.raft_follower.mark_the_last_chunk``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pysyncobj.serializer import Serializer

from cluster.raft_follower import mark_the_last_chunk

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
