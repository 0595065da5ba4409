"""migratory/server/handshake_slots.py: at most ``limit`` connections of a listener wait for
their handshake; past it, the oldest (of an address holding more than half, if any) goes."""

from __future__ import annotations

import pytest

from migratory.server.handshake_slots import Evicted, PendingHandshakes


def test_within_the_limit_nothing_is_closed() -> None:
    pending = PendingHandshakes[int](3)
    assert [pending.add(i, "a") for i in range(3)] == [None, None, None]
    assert len(pending) == 3 and pending.evicted == 0


def test_past_the_limit_an_address_holding_most_places_loses_its_oldest() -> None:
    pending = PendingHandshakes[str](4)
    for key, address in [("m1", "member"), ("x1", "attacker"), ("x2", "attacker"),
                         ("x3", "attacker")]:
        assert pending.add(key, address) is None
    assert pending.add("m2", "member") == Evicted("x1", "attacker", 3)
    assert pending.add("x4", "attacker") == Evicted("x2", "attacker", 3)
    assert "m1" in pending and "m2" in pending and pending.evicted == 2


def test_past_the_limit_without_such_an_address_the_oldest_goes() -> None:
    """An attacker spread over many addresses: a member dialling twice at once is the
    most crowded address, yet its handshakes are the youngest and stay."""
    pending = PendingHandshakes[str](4)
    for key, address in [("x1", "a"), ("y1", "b"), ("m1", "member"), ("m2", "member")]:
        assert pending.add(key, address) is None
    assert pending.add("z1", "c") == Evicted("x1", "a", 1)
    assert pending.add("w1", "d") == Evicted("y1", "b", 1)
    assert "m1" in pending and "m2" in pending


def test_one_address_alone_loses_its_oldest_first() -> None:
    pending = PendingHandshakes[int](2)
    pending.add(0, "a")
    pending.add(1, "a")
    assert pending.add(2, "a") == Evicted(0, "a", 3)
    assert pending.add(3, "a") == Evicted(1, "a", 3)


def test_removed_ones_free_their_place_and_removing_twice_is_harmless() -> None:
    pending = PendingHandshakes[int](2)
    pending.add(0, "a")
    pending.add(1, "b")
    pending.remove(0)
    pending.remove(0)
    assert pending.add(2, "a") is None
    assert len(pending) == 2


def test_misuse_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        PendingHandshakes[int](0)
    pending = PendingHandshakes[int](2)
    pending.add(0, "a")
    with pytest.raises(ValueError):
        pending.add(0, "a")


def test_evict_makes_room_by_the_same_rule_and_nothing_when_empty() -> None:
    pending = PendingHandshakes[str](4)
    assert pending.evict() is None
    for key, address in [("a1", "a"), ("b1", "b"), ("b2", "b"), ("b3", "b")]:
        pending.add(key, address)
    assert pending.evict() == Evicted("b1", "b", 3)  # b holds more than half
    assert pending.evict() == Evicted("a1", "a", 1)  # then the oldest
    assert len(pending) == 2 and pending.evicted == 2
