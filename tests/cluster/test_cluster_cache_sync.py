"""Cache sync: exporting a hub's subjects and installing a peer's."""

from __future__ import annotations

import pytest

from cluster.cache_sync import (
    CacheSync,
    SubjectSync,
    SyncInstall,
    check_sync,
    export_sync,
    install_sync,
)
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.server.hub import Hub

IBM = "/Stocks/NYSE/IBM"
LAL = "/Scores/NBA/LAL"


def hub_at(seq: int, subject: str = IBM, *, into: Hub | None = None) -> Hub:
    hub = into or Hub(epoch=1, numbered_elsewhere=True, max_cached_messages=3)
    for n in range(1, seq + 1):
        hub.apply(Message(subject, str(n).encode(), epoch=5, seq=n, retained=n % 2 == 1), 0.0)
    return hub


def test_export_has_positions_snapshots_and_cached_messages() -> None:
    sync = export_sync(hub_at(5), 9)
    assert sync.clsn == 9
    (ibm,) = sync.subjects
    assert ibm.position == Position(5, 5)
    assert [m.seq for m in ibm.cached] == [3, 4, 5]
    assert ibm.snapshot is not None and ibm.snapshot.content == b"5"


def test_install_makes_the_subjects_those_of_the_peer() -> None:
    peer = hub_at(2, LAL, into=hub_at(4))
    hub = hub_at(1, "/Other/x/y")
    install_sync(hub, export_sync(peer, 3).subjects, 0.0)
    assert export_sync(hub, 3) == export_sync(peer, 3)
    assert hub.position("/Other/x/y") is None  # not at the peer: unnumbered again


def test_a_sync_behind_this_hub_keeps_the_hubs_newer_state() -> None:
    hub = hub_at(4)
    install_sync(hub, export_sync(hub_at(3), 1).subjects, 0.0)
    assert hub.position(IBM) == Position(5, 4)
    assert not hub.apply(Message(IBM, b"4", epoch=5, seq=4), 0.0)  # already applied


def test_subjects_the_sync_lacks_are_unnumbered_a_slice_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A member re-syncing that holds many subjects: each subject the sync lacks becomes
    unnumbered, a slice's worth at a time, and no step reads every subject's cached run
    (``Hub.numbered()``, which copied them all in one step: ~400,000 runs on a member
    at the k8s MaxSubjects)."""
    hub = hub_at(1)
    for i in range(50):
        hub_at(2, f"/Other/x/{i}", into=hub)
    subjects = export_sync(hub_at(3), 3).subjects
    runs_read: list[str] = []
    numbered = Hub.numbered

    def counted(self: Hub):  # type: ignore[no-untyped-def]
        for run in numbered(self):
            runs_read.append(run[0])
            yield run

    monkeypatch.setattr(Hub, "numbered", counted)
    install = SyncInstall(hub, subjects, 3)
    steps = 0
    while not install.step(0.0, budget=5):
        steps += 1
        assert steps < 100
    assert runs_read == []
    assert steps >= 10  # 51 names, 5 a slice
    assert hub.position(IBM) == Position(5, 3)
    assert all(hub.position(f"/Other/x/{i}") is None for i in range(50))


@pytest.mark.parametrize(
    "why",
    ["seq 0", "not ending at seq", "hole", "other epoch", "other subject"],
)
def test_a_malformed_record_is_refused_before_anything_changes(why: str) -> None:
    (good,) = export_sync(hub_at(5), 5).subjects
    c = good.cached
    bad = {
        "seq 0": SubjectSync(IBM, 5, 0, None, ()),
        "not ending at seq": SubjectSync(IBM, 5, 6, None, c),
        "hole": SubjectSync(IBM, 5, 5, None, (c[0], c[2])),
        "other epoch": SubjectSync(IBM, 6, 5, None, c),
        "other subject": SubjectSync(LAL, 5, 5, None, c),
    }[why]
    hub = hub_at(2, LAL)
    before = export_sync(hub, 0)
    with pytest.raises(ValueError):
        check_sync((bad,))
    with pytest.raises(ValueError):
        install_sync(hub, (good, bad), 0.0)
    assert export_sync(hub, 0) == before


def test_one_record_type_travels_the_link_and_the_dump() -> None:
    # the link codec and the replicated cache produce the same type the hub's sync takes
    from cluster import link_ops, replicated_cache

    assert link_ops.SubjectSync is SubjectSync and link_ops.CacheSync is CacheSync
    assert replicated_cache.SubjectSync is SubjectSync
