"""A seed refuses a damaged ClusterDataDir (cluster/raft_data_dir.py).

Each kind of damage is made on files written by pysyncobj's own journal and serializer,
and each test also shows what pysyncobj does with it alone: a raw error, or a log (or
term and vote) that is not what was written -- silently. Then a schedule on real
pysyncobj nodes (:mod:`raft_sim`): a seed whose journal pysyncobj reads as a shorter
log comes back, votes, and an acknowledged entry is lost; with the check it does not
come back.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import pickle
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from pysyncobj.journal import FileJournal
from raft_sim import RaftWorld
from test_raft_votes import seed_loses_its_disk_while_another_is_down

from cluster import raft_data_dir
from cluster.raft_data_dir import DamagedRaftData, check
from cluster.raft_follower import FollowerSafeSyncObj
from cluster.raft_votes import MARKER_SUFFIX
from cluster.tooling import free_base_port, member_settings

ENTRIES = 20
TERM = 3


def command(value: str) -> bytes:
    """A regular command as pysyncobj journals it: type 0, then a protocol-2 pickle."""
    return b"\x00" + pickle.dumps((0, (value,), {}), protocol=2)


def write_journal(path: Path, *, commit: int = ENTRIES - 2) -> None:
    journal = FileJournal(str(path))
    journal.add(b"\x01", 1, 0)  # the no-op pysyncobj starts every log with
    for index in range(2, ENTRIES + 1):
        journal.add(command(f"v{index}"), index, TERM)
    journal.setCurrentTerm(TERM, "127.0.0.1:2")
    journal.setRaftCommitIndex(commit)
    journal.onOneSecondTimer()  # stores the commit index, as pysyncobj does each second
    journal._destroy()


def records(path: Path) -> list[tuple[int, int]]:
    """(offset, size) of each record up to the end the header gives."""
    data = path.read_bytes()
    end, offset, found = struct.unpack_from("<I", data, 36)[0], 40, []
    while offset < end:
        size = struct.unpack_from("<I", data, offset)[0]
        found.append((offset, size))
        offset += size + 8
    return found


def overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def pysyncobj_log(path: Path) -> str:
    """What pysyncobj's journal makes of the file: the indices it loads, or its error."""
    try:
        journal = FileJournal(str(path))
    except Exception as exc:  # what start-up showed: a raw traceback
        return f"{type(exc).__name__}: {exc}"
    indices = [entry[1] for entry in journal[:]]
    term = journal.getCurrentTerm()
    journal._destroy()
    return f"{len(indices)} entries {indices[:1]}..{indices[-1:]}, term {term}"


WHOLE = f"{ENTRIES} entries [1]..[{ENTRIES}], term {TERM}"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    write_journal(tmp_path / "raft.journal")
    return tmp_path


def run_check(data_dir: Path, dump: bool = True) -> None:
    journal = str(data_dir / "raft.journal")
    check(journal, str(data_dir / "raft.dump") if dump else None, journal + MARKER_SUFFIX)


def test_canary_the_installed_pysyncobj_stores_term_and_vote_at_once(tmp_path: Path) -> None:
    """The term checks rest on it (raft_data_dir.TERM_STORED; docs/cluster.md)."""
    journal = FileJournal(str(tmp_path / "raft.journal"))
    journal.setCurrentTerm(4, "127.0.0.1:3")  # no onOneSecondTimer: on disk at once
    meta = pickle.loads((tmp_path / "raft.journal.meta").read_bytes())
    journal._destroy()
    assert raft_data_dir.TERM_STORED
    assert (meta["currentTerm"], meta["votedForNodeId"]) == (4, "127.0.0.1:3")


def test_a_whole_journal_passes(data_dir: Path) -> None:
    run_check(data_dir)
    assert pysyncobj_log(data_dir / "raft.journal") == WHOLE


def record_of(index: int) -> Callable[[Path], tuple[int, int]]:
    return lambda journal: records(journal)[index - 1]


def cut(journal: Path) -> None:  # power loss in the middle of the records
    offset, _ = record_of(12)(journal)
    os.truncate(journal, offset + 10)


def end_rewound(journal: Path) -> None:  # the header's end of records, back to entry 15
    offset, _ = record_of(16)(journal)
    overwrite(journal, 36, struct.pack("<I", offset))


def size_overwritten(journal: Path) -> None:
    offset, _ = record_of(10)(journal)
    overwrite(journal, offset, struct.pack("<I", 5000))


def zeros_in_the_middle(journal: Path) -> None:
    offset, _ = record_of(8)(journal)
    overwrite(journal, offset, bytes(60))


def type_byte_overwritten(journal: Path) -> None:
    offset, _ = record_of(10)(journal)
    overwrite(journal, offset + 20, b"\xfe")


def index_overwritten(journal: Path) -> None:
    offset, _ = record_of(10)(journal)
    overwrite(journal, offset + 4, struct.pack("<Q", 999))


def header_zeroed(journal: Path) -> None:
    overwrite(journal, 0, bytes(40))


def emptied(journal: Path) -> None:
    journal.write_bytes(b"")


JOURNAL_DAMAGE = [
    (emptied, "0 bytes", "ValueError: cannot mmap an empty file"),
    (cut, "the header puts the end of the records at byte", "error: unpack requires"),
    (header_zeroed, "does not start with b'PYSYNCOBJ'", "0 entries"),
    (end_rewound, "ends at entry 15, but entry 18 was committed", "15 entries [1]..[15]"),
    (size_overwritten, "has size 5000, past the end", "10 entries [1]..[10]"),
    (zeros_in_the_middle, "has size 0", "error: unpack requires"),
    (type_byte_overwritten, "command type 254", WHOLE),  # then skipped as a no-op
    (index_overwritten, "holds entry 999 after entry 9", WHOLE),  # entry 10 is 999
]


@pytest.mark.parametrize(("damage", "problem", "pysyncobj"), JOURNAL_DAMAGE,
                         ids=[d[0].__name__ for d in JOURNAL_DAMAGE])
def test_a_damaged_journal_is_refused(
    data_dir: Path, damage: Callable[[Path], None], problem: str, pysyncobj: str
) -> None:
    journal = data_dir / "raft.journal"
    damage(journal)
    with pytest.raises(DamagedRaftData) as refused:
        run_check(data_dir)
    assert refused.value.path == str(journal)
    assert problem in str(refused.value) and "Move the directory aside" in str(refused.value)
    assert pysyncobj_log(journal).startswith(pysyncobj)  # pysyncobj alone (it may write)


def test_a_journal_that_lost_records_consistently_is_not_seen(tmp_path: Path) -> None:
    """The documented limit: power loss can leave a shorter journal that is whole in
    every way; only a commit index stored past its end gives it away (above)."""
    write_journal(tmp_path / "raft.journal", commit=12)
    end_rewound(tmp_path / "raft.journal")
    run_check(tmp_path)


def meta_garbage(meta: Path) -> None:
    meta.write_bytes(b"garbage")


def meta_emptied(meta: Path) -> None:
    meta.write_bytes(b"")


def meta_a_directory(meta: Path) -> None:  # unreadable, as root can test it
    meta.unlink()
    meta.mkdir()


def meta_removed(meta: Path) -> None:
    meta.unlink()


def meta_older_term(meta: Path) -> None:
    meta.write_bytes(pickle.dumps({"currentTerm": 1, "votedForNodeId": None,
                                   "raftCommitIndex": 5}))


META_DAMAGE = [
    (meta_garbage, "not a pickle", 0),
    (meta_emptied, "not a pickle", 0),
    (meta_a_directory, "cannot be opened (Is a directory)", 0),
    (meta_removed, "missing, while", 0),
    (meta_older_term, "current term 1, but", 1),
]


@pytest.mark.parametrize(("damage", "problem", "term"), META_DAMAGE,
                         ids=[d[0].__name__ for d in META_DAMAGE])
def test_a_damaged_term_and_vote_file_is_refused(
    data_dir: Path, damage: Callable[[Path], None], problem: str, term: int
) -> None:
    """pysyncobj reads it with a bare except: the seed forgot its term and vote."""
    meta = data_dir / "raft.journal.meta"
    damage(meta)
    journal = FileJournal(str(data_dir / "raft.journal"))
    assert (journal.getCurrentTerm(), journal.getVotedForNodeId()) == (term, None)
    journal._destroy()
    with pytest.raises(DamagedRaftData) as refused:
        run_check(data_dir)
    assert refused.value.path == str(meta) and problem in str(refused.value)


def compacted(data_dir: Path) -> Path:
    """A journal that starts at entry 9 and its dump (a gzipped pickle, as pysyncobj
    writes it)."""
    journal = data_dir / "raft.journal"
    pysyncobj = FileJournal(str(journal))
    pysyncobj.deleteEntriesTo(8)
    pysyncobj._destroy()
    dump = data_dir / "raft.dump"
    state = ([{}, {"applied": list(range(9))}], (command("v9"), 9, TERM),
             (command("v8"), 8, TERM), set())
    dump.write_bytes(gzip.compress(pickle.dumps(state, protocol=2)))
    run_check(data_dir)
    return dump


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda dump: os.truncate(dump, dump.stat().st_size // 2), "not a whole gzip"),
        (lambda dump: dump.write_bytes(b"garbage" * 50), "not a whole gzip"),
        (lambda dump: dump.write_bytes(b""), "empty"),
        (lambda dump: dump.unlink(), "starts at entry 9, but there is no"),
    ],
    ids=["truncated", "garbage", "empty", "missing"],
)
def test_a_damaged_dump_is_refused(
    data_dir: Path, damage: Callable[[Path], None], problem: str
) -> None:
    """pysyncobj logged "failed to load full dump" (or nothing, without a dump) and the
    seed applied nothing for ever: its journal starts after entry 1."""
    dump = compacted(data_dir)
    damage(dump)
    with pytest.raises(DamagedRaftData) as refused:
        run_check(data_dir)
    assert problem in str(refused.value)


def test_a_journal_removed_beside_its_dump_is_refused(data_dir: Path) -> None:
    """Otherwise the seed would start "empty" with the dump's log: not empty at all."""
    compacted(data_dir)
    (data_dir / "raft.journal").unlink()
    with pytest.raises(DamagedRaftData, match=r"raft.journal: missing, while .*raft.dump"):
        run_check(data_dir)


def test_a_journal_emptied_beside_its_dump_starts_from_the_dump(data_dir: Path) -> None:
    """pysyncobj empties the journal, then writes the dump's last two entries (loading
    a leader's dump, or its own at start-up): a kill in between leaves no entry, and the
    dump it loads next holds the state. Without a dump, no entry is damage."""
    compacted(data_dir)
    journal = FileJournal(str(data_dir / "raft.journal"))
    journal.clear()
    journal._destroy()
    run_check(data_dir)
    (data_dir / "raft.dump").unlink()
    with pytest.raises(DamagedRaftData, match="holds no entry at all"):
        run_check(data_dir)


def test_a_journal_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "raft.journal").mkdir()
    with pytest.raises(DamagedRaftData, match="cannot be opened"):
        run_check(tmp_path)


def test_a_journal_this_user_may_not_read_is_refused_without_moving_it_aside(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Permission denied is no damage: the log may be whole, and moving the directory
    aside (the remedy for damage) would make the seed one that lost its disk. Before: that
    remedy was given (a journal of mode 000, by hand as a user without it). The tests run
    as root, whom no mode refuses: the kernel's refusal is planted on the journal."""
    journal = str(data_dir / "raft.journal")

    def refusing_open(path: str, *args: object) -> object:
        if path == journal:
            raise PermissionError(13, "Permission denied", path)
        return open(path, *args)  # (the module's name; the builtin here)

    monkeypatch.setattr(raft_data_dir, "open", refusing_open, raising=False)
    with pytest.raises(DamagedRaftData) as refused:
        run_check(data_dir)
    assert str(refused.value) == (
        f"[Errno 117] ClusterDataDir: {journal}: cannot be opened (Permission denied); "
        f"{raft_data_dir.ACCESS_REMEDY}")
    assert "Move the directory aside" not in str(refused.value)


def test_a_first_start_killed_while_pysyncobj_created_the_journal_starts_empty(
    tmp_path: Path,
) -> None:
    """The empty-start marker is written before pysyncobj creates the journal: a 0-byte
    journal beside it alone held nothing; it is removed and the seed starts empty."""
    journal = tmp_path / "raft.journal"
    Path(str(journal) + MARKER_SUFFIX).write_bytes(b"")
    journal.write_bytes(b"")
    run_check(tmp_path)
    assert not journal.exists()


def test_a_seed_member_on_a_damaged_journal_exits_with_what_to_do(tmp_path: Path) -> None:
    """The member process: one line naming the file and the way out, exit 1, no
    traceback (it was ``ValueError: cannot mmap an empty file`` and a traceback)."""
    data_dir = tmp_path / "migratory-0"
    data_dir.mkdir()
    (data_dir / "raft.journal").write_bytes(b"")
    settings = member_settings(0, members=3, seeds=3, mode="Guaranteed",
                               base_port=free_base_port(3), password="pw", data_dir=tmp_path)
    args = [item for key, value in settings.items() if value
            for item in ("--set", f"{key}={value}")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIGRATORY_")}
    result = subprocess.run([sys.executable, "-m", "cluster", "serve", *args], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"migratory: ClusterDataDir: {data_dir / 'raft.journal'}: 0 bytes")
    assert "Move the directory aside" in last


class TrustsItsJournal(FollowerSafeSyncObj):  # type: ignore[misc]
    """pysyncobj's own start-up: whatever its journal reads as is the log."""

    def _check_data_dir(self, journal_file: str, dump_file: str | None) -> None:
        pass


def damage_e1(world: RaftWorld, address: str) -> None:
    """``address`` is killed, the size field of the record holding e1 in its journal is
    overwritten, and it restarts -- if it will."""
    world.crash(address)
    journal = world.dir / (address.replace(":", "_") + ".journal")
    data = journal.read_bytes()
    offset = next(at for at, size in records(journal) if b"e1" in data[at + 20:at + 4 + size])
    overwrite(journal, offset, struct.pack("<I", 10**6))
    with contextlib.suppress(DamagedRaftData):
        world.restart(address)


@pytest.mark.parametrize("node_class", [FollowerSafeSyncObj, TrustsItsJournal],
                         ids=["checked", "pysyncobj"])
def test_a_damaged_seed_does_not_come_back_with_a_shorter_log(
    node_class: type[FollowerSafeSyncObj],
) -> None:
    """Leader A and follower B acknowledge e1, e2 (C lacks them); A goes down and B
    restarts on a damaged journal. pysyncobj reads it up to e1 (garbled) and B, holding
    a longer log than C, is elected: e2, acknowledged, is lost. Checked, B stays down
    and no leader is elected without A."""
    world, _ = seed_loses_its_disk_while_another_is_down(node_class, damage_e1)
    try:
        if node_class is FollowerSafeSyncObj:
            assert len(world.nodes) == 1 and world.leader() is None  # B refused to start
            assert world.violations() == []
        else:
            assert world.leader() is not None
            assert world.violations(), "the planted start-up must lose e2"
    finally:
        world.close()


def test_what_a_seed_killed_mid_write_left_is_removed_and_said(
    data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A SIGKILL while the dump, a leader's dump, the term and vote or a trimmed journal
    was being written leaves its temporary file: removed at start-up, one line each;
    the files pysyncobj reads stay as they were."""
    dump = compacted(data_dir)
    kept = {p.name: p.read_bytes() for p in data_dir.iterdir()}
    whole = gzip.compress(pickle.dumps(([{}, {"later": 1}], None, None, set()), protocol=2))
    left = {
        "raft.dump.tmp": whole[: len(whole) // 2],  # its writer killed halfway
        "raft.dump.1.tmp": b"\x1f\x8b" + b"\x00" * 100,  # a leader's dump, one part in
        "raft.journal.meta.tmp": b"\x80",
        "raft.journal.trim": b"SYNCOBJ" + b"\x00" * 33,
    }
    for name, data in left.items():
        (data_dir / name).write_bytes(data)
    with caplog.at_level("WARNING", logger="migratory.raft"):
        run_check(data_dir)
    assert {p.name: p.read_bytes() for p in data_dir.iterdir()} == kept
    said = [r.getMessage() for r in caplog.records if "removed" in r.getMessage()]
    assert len(said) == len(left)
    assert any(f"raft.dump.tmp ({len(whole) // 2} bytes), left half-written" in line
               for line in said)
    assert dump.exists()
