"""The coordinator: deterministic numbering of committed batches, plain picklable state."""

from __future__ import annotations

import itertools
import pickle
import zlib

import pytest

from cluster import coordination
from cluster.coordination import (
    GROUP_COUNT,
    UNNUMBERED_EPOCH,
    Coordinator,
    PublishRequest,
    subject_group,
)
from migratory.model.message import Message, MessageType
from migratory.model.position import Position

IBM = "/Stocks/NYSE/IBM"
GM = "/Stocks/NASDAQ/GM"  # same subject group as IBM
LAL = "/Scores/NBA/LAL"


REFS = itertools.count(1)


def request(
    subject: str, content: str, ref: int | None = None, origin: str = "a"
) -> PublishRequest:
    """A publish request; ``ref``: the next of this module's refs (an origin's refs grow
    as it takes publishes: the coordinator drops one not above the last it numbered)."""
    ref = next(REFS) if ref is None else ref
    message = Message(subject, content.encode(), closure=f"c{ref}", epoch=9, seq=99)
    return PublishRequest(origin, ref, message)


def test_subject_group_is_crc32_modulo_group_count() -> None:
    assert GROUP_COUNT == 64
    assert subject_group(IBM) == zlib.crc32(IBM.encode()) % 64
    assert subject_group(GM) == subject_group(IBM) != subject_group(LAL)
    assert subject_group("/Météo/Paris/été") == zlib.crc32("/Météo/Paris/été".encode()) % 64


def test_batch_numbers_messages_in_order_with_the_group_epoch() -> None:
    coordinator = Coordinator()
    batch = coordinator.apply_batch(
        500, [request(IBM, "a", 1), request(LAL, "b", 2), request(IBM, "c", 3, "b")]
    )
    assert batch.clsn == 1
    assert [(m.subject, m.position) for m in batch.messages] == [
        (IBM, Position(500, 1)),
        (LAL, Position(500, 1)),
        (IBM, Position(500, 2)),
    ]
    assert all(m.type is MessageType.UPDATE and m.closure is None for m in batch.messages)
    assert batch.origins == (("a", 1), ("a", 2), ("b", 3))
    assert coordinator.position(IBM) == Position(500, 2)
    assert coordinator.position("/never/published") is None


def test_epoch_candidate_only_matters_for_the_first_batch_of_a_group() -> None:
    coordinator = Coordinator()
    coordinator.apply_batch(500, [request(IBM, "a")])
    second = coordinator.apply_batch(777, [request(GM, "b"), request(IBM, "c"), request(LAL, "d")])
    assert [m.position for m in second.messages] == [
        Position(500, 1),  # GM shares IBM's group: its epoch is already set
        Position(500, 2),
        Position(777, 1),  # LAL's group is new
    ]
    assert second.clsn == 2


def test_same_batches_give_same_numbering_on_every_seed() -> None:
    batches = [
        (11, [request(IBM, "a"), request(LAL, "b")]),
        (22, []),
        (33, [request(GM, "c"), request(IBM, "d")]),
    ]
    seeds = [Coordinator() for _ in range(3)]
    results = [[seed.apply_batch(e, rs) for e, rs in batches] for seed in seeds]
    assert results[0] == results[1] == results[2]
    assert [b.clsn for b in results[0]] == [1, 2, 3]
    assert seeds[0].to_state() == seeds[1].to_state() == seeds[2].to_state()


def test_positions_now_are_the_positions_as_they_stood() -> None:
    """The Raft thread takes them when it loads a dump and goes on numbering."""
    coordinator = Coordinator()
    coordinator.apply_batch(11, [request(IBM, "a"), request(LAL, "b"), request(IBM, "c")])
    now = coordinator.positions_now()
    assert dict(now) == coordinator.positions() == {IBM: now[IBM], LAL: now[LAL]}
    assert len(now) == 2 and now[IBM][1] == 2
    coordinator.apply_batch(22, [request(IBM, "d"), request(GM, "e")])
    assert dict(now) != coordinator.positions() and now[IBM][1] == 2 and GM not in now


def test_a_leader_change_does_not_renumber_a_restored_state() -> None:
    old_leader = Coordinator()
    old_leader.apply_batch(11, [request(IBM, "a"), request(IBM, "b")])
    new_leader = Coordinator.from_state(old_leader.to_state())
    batch = new_leader.apply_batch(99, [request(IBM, "c")])
    assert batch.messages[0].position == Position(11, 3)
    assert batch.clsn == 2


def test_unnumbered_epoch_is_never_given_to_a_group() -> None:
    coordinator = Coordinator()
    batch = coordinator.apply_batch(UNNUMBERED_EPOCH, [request(IBM, "a")])
    assert batch.messages[0].epoch == UNNUMBERED_EPOCH + 1


@pytest.mark.parametrize("candidate", [0, -1, 2**48])
def test_bad_epoch_candidate_raises_and_changes_nothing(candidate: int) -> None:
    coordinator = Coordinator()
    with pytest.raises(ValueError, match="epoch candidate"):
        coordinator.apply_batch(candidate, [request(IBM, "a")])
    assert coordinator.to_state() == {
        "clsn": 0, "group_epochs": {}, "seqs": {}, "origin_refs": {}, "recent": {}
    }


def test_pickle_round_trip_keeps_numbering() -> None:
    coordinator = Coordinator()
    coordinator.apply_batch(11, [request(IBM, "a"), request(LAL, "b")])
    restored = pickle.loads(pickle.dumps(coordinator))
    assert restored.to_state() == coordinator.to_state()
    again = request(IBM, "c")
    assert restored.apply_batch(5, [again]) == coordinator.apply_batch(5, [again])


def test_state_is_plain_data() -> None:
    coordinator = Coordinator()
    coordinator.apply_batch(11, [request(IBM, "a", 7)])
    state = coordinator.to_state()
    assert state == {"clsn": 1, "group_epochs": {subject_group(IBM): 11}, "seqs": {IBM: 1},
                     "origin_refs": {"a": 7}, "recent": {"a": {7: 11 << 64 | 1}}}
    # nothing else is replicated (the rest: a dump's numbering while it decodes)
    assert {k: v for k, v in vars(coordinator).items() if not k.startswith("_")} == state
    state["seqs"][IBM] = 42  # a copy
    assert coordinator.seqs[IBM] == 1


@pytest.mark.parametrize(
    "state",
    [
        {},
        {"clsn": -1, "group_epochs": {}, "seqs": {}},
        {"clsn": True, "group_epochs": {}, "seqs": {}},
        {"clsn": 0, "group_epochs": {64: 5}, "seqs": {}},
        {"clsn": 0, "group_epochs": {1: 0}, "seqs": {}},
        {"clsn": 0, "group_epochs": {}, "seqs": {IBM: 1}},  # a seq without its group's epoch
        {"clsn": 0, "group_epochs": {subject_group(IBM): 5}, "seqs": {IBM: "1"}},
        {"clsn": 0, "group_epochs": {}, "seqs": {}, "origin_refs": {"a": "1"}},
        {"clsn": 0, "group_epochs": {}, "seqs": {}, "origin_refs": [("a", 1)]},
        {"clsn": 0, "group_epochs": {}, "seqs": {}, "recent": {"a": {1: 1}}},  # epoch 0
        {"clsn": 0, "group_epochs": {}, "seqs": {}, "recent": {"a": {1: (5, 1)}}},
        {"clsn": 0, "group_epochs": {}, "seqs": {}, "recent": {"a": {"1": 5 << 64 | 1}}},
        {"clsn": 0, "group_epochs": {}, "seqs": {}, "recent": {"a": [(1, 5 << 64 | 1)]}},
    ],
)
def test_malformed_state_is_rejected(state: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Coordinator.from_state(state)


def test_apply_wire_numbers_exactly_as_apply_batch() -> None:
    from cluster.raft import from_wire, to_wire
    from migratory.model.message import Qos

    requests = [
        PublishRequest("m#1", i, Message(f"/a/{i % 3}", b"x", {"k": "v"}, i % 2 == 0,
                                         Qos.GUARANTEED if i % 3 else Qos.STANDARD))
        for i in range(10)
    ]
    wire = to_wire(requests)
    assert from_wire(wire) == requests
    left, right = Coordinator(), Coordinator()
    assert left.apply_wire(777, wire) == right.apply_batch(777, requests)
    assert left.to_state() == right.to_state()


def test_a_request_older_than_one_numbered_from_its_origin_is_dropped() -> None:
    """A non-seed's forwards to a seed it left reach that seed late (a stalled link, a
    stopped seed) and are submitted after what it forwarded through the next seed:
    numbered, a publisher's older message came after its newer one (and became the
    subject's snapshot; test_cluster_fault_combinations.py,
    test_a_non_seeds_forwards_delivered_late_after_it_moved_on)."""
    coordinator = Coordinator()
    coordinator.apply_batch(11, [request(IBM, "1", 1, "n"), request(IBM, "2", 2, "n")])
    newer = coordinator.apply_batch(11, [request(IBM, "5", 5, "n"), request(LAL, "x", 3, "s")])
    assert [m.content for m in newer.messages] == [b"5", b"x"]
    late = coordinator.apply_batch(
        11, [request(IBM, "3", 3, "n"), request(IBM, "4", 4, "n"), request(IBM, "y", 4, "s"),
             request(IBM, "6", 6, "n"), request(IBM, "5 again", 5, "n")],
    )
    assert [(m.content, m.seq) for m in late.messages] == [(b"y", 4), (b"6", 5)]
    assert late.origins == (("s", 4), ("n", 6))
    assert late.clsn == 3  # the batch counts, whatever it kept
    assert coordinator.origin_refs == {"s": 4, "n": 6}  # the most lately numbered last


def test_a_dropped_request_no_copy_of_which_was_numbered_is_overtaken() -> None:
    """A copy the per-origin order drops whose ref was never numbered, at or above the
    oldest of its origin's window: never numbered, and never will be (the origin's last
    ref only grows), so the batch names it (``overtaken``) and its member fails it at
    once. Before, it was dropped unanswered: its publish timed out "outcome unknown"
    (test_cluster_resend.py, h163: 191 and 1,227 in two runs)."""
    coordinator = Coordinator()
    coordinator.apply_batch(11, [request(IBM, "1", 1, "n"), request(IBM, "2", 2, "n")])
    coordinator.apply_batch(11, [request(IBM, "5", 5, "n")])  # 3 and 4: lost on the way
    late = coordinator.apply_batch(
        11, [request(IBM, "3", 3, "n"), request(IBM, "2", 2, "n"), request(IBM, "6", 6, "n"),
             request(IBM, "4", 4, "n"), request(IBM, "4", 4, "n"), request(LAL, "x", 9, "s")])
    assert late.origins == (("n", 6), ("s", 9))
    assert late.repeats == (("n", 2, 11, 2),)  # numbered before: its position
    assert late.overtaken == (("n", 3), ("n", 4), ("n", 4))
    assert coordinator.apply_batch(11, [request(IBM, "3", 3, "n")]).overtaken == (("n", 3),)


def test_a_dropped_request_below_its_window_or_without_one_is_not_overtaken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Below the oldest ref of its origin's window (or with the window evicted) a ref may
    have been numbered: the coordinator does not know, it says nothing (unknown)."""
    monkeypatch.setattr(coordination, "RECENT_PER_ORIGIN", 4)
    monkeypatch.setattr(coordination, "RECENT_ORIGINS", 1)
    coordinator = Coordinator()
    for ref in range(1, 21, 2):  # odd refs numbered; the window keeps 13..19 or so
        coordinator.apply_batch(5, [request(IBM, str(ref), ref, "n")])
    oldest = next(iter(coordinator.recent["n"]))
    assert coordinator.apply_batch(5, [request(IBM, "b", oldest - 1, "n")]).overtaken == ()
    assert coordinator.apply_batch(5, [request(IBM, "c", oldest + 1, "n")]).overtaken == (
        ("n", oldest + 1),)
    coordinator.apply_batch(5, [request(LAL, "o", 1, "other")])  # evicts "n"'s window
    assert "n" not in coordinator.recent
    assert coordinator.apply_batch(5, [request(IBM, "d", 18, "n")]).overtaken == ()


def test_apply_wire_drops_what_apply_batch_drops() -> None:
    from cluster.raft import to_wire

    batches = [[request(IBM, "1", 4, "n")], [request(IBM, "2", 2, "n"), request(IBM, "3", 9, "n")]]
    left, right = Coordinator(), Coordinator()
    for requests in batches:
        assert left.apply_wire(5, to_wire(requests)) == right.apply_batch(5, requests)
    assert left.to_state() == right.to_state()
    assert left.digest() == right.digest()
    late = [request(IBM, "4", 5, "n")]  # (4 and 9 numbered)
    assert left.apply_wire(5, to_wire(late)) == right.apply_batch(5, late)
    assert right.apply_batch(5, late).overtaken == (("n", 5),)


def test_the_origins_kept_are_bounded_the_oldest_forgotten_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(coordination, "ORIGINS_KEPT", 3)
    coordinator = Coordinator()
    for origin in "abcd":
        coordinator.apply_batch(5, [request(IBM, origin, 10, origin)])
    coordinator.apply_batch(5, [request(IBM, "b", 11, "b")])  # b numbered again: kept longest
    coordinator.apply_batch(5, [request(IBM, "e", 1, "e")])
    assert list(coordinator.origin_refs) == ["d", "b", "e"]


def test_a_coordinator_pickled_before_origin_refs_loads_without_them() -> None:
    """A seed restarted on a dump an older version wrote."""
    old = Coordinator()
    old.apply_batch(11, [request(IBM, "a", 1)])
    del old.origin_refs
    restored = Coordinator.__new__(Coordinator)  # as pickle loads the code before's
    restored.__setstate__({k: v for k, v in vars(old).items() if not k.startswith("_")})
    assert restored.origin_refs == {}
    assert restored.apply_batch(11, [request(IBM, "b", 1)]).messages[0].seq == 2
    state = Coordinator().to_state()
    del state["origin_refs"]
    assert Coordinator.from_state(state).origin_refs == {}


# --- a re-sent copy of a numbered request: answered with the first copy's position ---


def test_a_copy_of_a_numbered_request_is_answered_with_the_first_position() -> None:
    """A non-seed that switched seeds forwards its unanswered publishes again; those that
    had committed through the seed it left are not numbered again but answered in the
    batch (``repeats``) with the position every subscriber saw."""
    coordinator = Coordinator()
    first = coordinator.apply_batch(11, [request(IBM, "1", 1, "n"), request(LAL, "2", 2, "n")])
    again = coordinator.apply_batch(
        11, [request(IBM, "1", 1, "n"), request(LAL, "2", 2, "n"), request(IBM, "3", 3, "n"),
             request(IBM, "3", 3, "n")],  # a copy in the batch of the first: numbered once
    )
    assert [(m.content, m.seq) for m in again.messages] == [(b"3", 2)]
    assert again.origins == (("n", 3),)
    (ibm, lal) = (m.position for m in first.messages)
    assert ibm is not None and lal is not None
    assert again.repeats == (("n", 1, ibm.epoch, ibm.seq), ("n", 2, lal.epoch, lal.seq),
                             ("n", 3, 11, 2))
    assert first.repeats == ()
    # overtaken, never numbered: dropped without an answer, as before
    assert coordinator.apply_batch(11, [request(IBM, "x", 0, "n")]).repeats == ()


def test_apply_wire_answers_repeats_as_apply_batch() -> None:
    from cluster.raft import to_wire

    batches = [[request(IBM, "1", 4, "n"), request(LAL, "2", 5, "n")],
               [request(IBM, "1", 4, "n"), request(IBM, "3", 6, "n"), request(LAL, "2", 5, "n")]]
    left, right = Coordinator(), Coordinator()
    for requests in batches:
        assert left.apply_wire(5, to_wire(requests)) == right.apply_batch(5, requests)
    assert left.apply_wire(5, to_wire(batches[1])).repeats == (("n", 4, 5, 1), ("n", 6, 5, 2),
                                                              ("n", 5, 5, 1))
    assert left.digest() != right.digest()  # the window is in the digest
    right.apply_batch(5, batches[1])
    assert left.to_state() == right.to_state() and left.digest() == right.digest()


def test_the_window_is_bounded_per_origin_and_in_origins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(coordination, "RECENT_PER_ORIGIN", 4)
    monkeypatch.setattr(coordination, "RECENT_ORIGINS", 2)
    coordinator = Coordinator()
    for ref in range(1, 21):
        coordinator.apply_batch(5, [request(IBM, str(ref), ref, "n")])
        assert 1 <= len(coordinator.recent["n"]) <= 5  # cut back to 4 past 5
    assert list(coordinator.recent["n"]) == [17, 18, 19, 20]
    # a copy older than the window: dropped, not answered (outcome unknown, as before)
    assert coordinator.apply_batch(5, [request(IBM, "16", 16, "n")]).repeats == ()
    assert coordinator.apply_batch(5, [request(IBM, "17", 17, "n")]).repeats == (
        ("n", 17, 5, 17),)
    for origin in "abc":
        coordinator.apply_batch(5, [request(LAL, origin, 1, origin)])
    assert list(coordinator.recent) == ["b", "c"]  # the most lately numbered
    assert coordinator.apply_batch(5, [request(IBM, "20", 20, "n")]).repeats == ()


def test_the_window_survives_a_dump_and_a_state_copy() -> None:
    """It is replicated state: a seed restarted from its dump (or sent the leader's)
    answers a copy as the others do."""
    coordinator = Coordinator()
    coordinator.apply_batch(11, [request(IBM, "1", 1, "n"), request(LAL, "2", 2, "n")])
    copies = [pickle.loads(pickle.dumps(coordinator)),
              Coordinator.from_state(coordinator.to_state())]
    resent = [request(IBM, "1", 1, "n"), request(LAL, "2", 2, "n"), request(IBM, "3", 3, "n")]
    expected = coordinator.apply_batch(11, resent)
    assert expected.repeats
    for copy in copies:
        assert copy.apply_batch(11, resent) == expected
        assert copy.digest() == coordinator.digest()


def test_a_coordinator_pickled_before_the_window_loads_without_it() -> None:
    """A seed restarted on a dump an older version wrote (no ``recent``): it answers no
    copy of what that version numbered, and numbers none again."""
    old = Coordinator()
    old.apply_batch(11, [request(IBM, "a", 1)])
    del old.recent
    restored = Coordinator.__new__(Coordinator)  # as pickle loads the code before's
    restored.__setstate__({k: v for k, v in vars(old).items() if not k.startswith("_")})
    assert restored.recent == {}
    copy = restored.apply_batch(11, [request(IBM, "a", 1)])
    assert copy.messages == () and copy.repeats == ()
    assert restored.apply_batch(11, [request(IBM, "b", 2)]).repeats == ()
    state = Coordinator().to_state()
    del state["recent"]
    assert Coordinator.from_state(state).recent == {}
