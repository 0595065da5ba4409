"""The Raft front's preamble (cluster/raft_front.py), bytes in, verdict out: only the
cluster password opens it, for one seed, once, within the window; the reader never
takes a byte past it. Parsers three ways: whole, a byte at a time, in any split."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.raft_front import (
    LABEL,
    NONCE_SIZE,
    PREAMBLE_SIZE,
    WINDOW_SECONDS,
    PreambleGate,
    PreambleReader,
    Refusal,
    derive_key,
    encode_preamble,
)

KEY = derive_key("cluster-password")
TARGET = "seed-0.migratory:7001"
NOW = 1_800_000_000.0


def preamble(now: float = NOW, *, key: bytes = KEY, target: str = TARGET,
             nonce: bytes | None = None) -> bytes:
    return encode_preamble(key, target=target, now=now,
                           nonce=os.urandom(NONCE_SIZE) if nonce is None else nonce)


def gate(**kwargs: float) -> PreambleGate:
    return PreambleGate(KEY, address=TARGET, **kwargs)  # type: ignore[arg-type]


def test_a_seed_with_the_password_is_admitted() -> None:
    sent = preamble()
    assert len(sent) == PREAMBLE_SIZE == 64
    assert sent.startswith(LABEL)
    verdict = gate().verify(sent, NOW + 0.25)
    assert verdict.admitted
    assert verdict.skew == pytest.approx(-0.25)


def test_the_key_needs_a_password_and_depends_on_it() -> None:
    with pytest.raises(ValueError):
        derive_key("")
    assert derive_key("another") != KEY
    assert derive_key("cluster-password") == KEY


def test_another_password_is_refused() -> None:
    sent = preamble(key=derive_key("not the cluster password"))
    assert gate().verify(sent, NOW).refusal is Refusal.BAD_MAC


def test_a_preamble_for_another_seed_is_refused() -> None:
    sent = preamble(target="seed-1.migratory:7001")
    assert gate().verify(sent, NOW).refusal is Refusal.BAD_MAC


def test_a_replayed_preamble_is_refused() -> None:
    checker = gate()
    sent = preamble()
    assert checker.verify(sent, NOW).admitted
    assert checker.verify(sent, NOW + 1).refusal is Refusal.REPLAYED
    assert checker.verify(preamble(), NOW + 1).admitted  # a new nonce is fine


@pytest.mark.parametrize("offset", [-WINDOW_SECONDS - 0.01, WINDOW_SECONDS + 0.01, -1e6, 1e6])
def test_a_preamble_outside_the_window_is_refused(offset: float) -> None:
    verdict = gate().verify(preamble(NOW + offset), NOW)
    assert verdict.refusal is Refusal.STALE
    assert verdict.skew == pytest.approx(offset, abs=0.002)


def test_a_nonce_forgotten_with_the_window_is_stale() -> None:
    checker = gate(window=10)
    old = preamble(NOW)
    assert checker.verify(old, NOW).admitted
    assert checker.verify(preamble(NOW + 20), NOW + 20).admitted  # forgets the first
    assert checker.remembered == 1
    assert checker.verify(old, NOW + 20).refusal is Refusal.STALE


HOUR, DAY = 3600.0, 86400.0


def test_every_seeds_clock_going_back_does_not_lock_the_links_out() -> None:
    """An NTP step back of every seed (or of two sharing a node): preambles stamped by
    the clocks as they are now are admitted at once. Before, the floor left by a nonce
    forgotten before the step refused them all as replays until the clocks came back up
    to it (an hour for an hour's step: no Raft link could form)."""
    checker = gate()
    assert checker.verify(preamble(NOW), NOW).admitted
    assert checker.verify(preamble(NOW + 300), NOW + 300).admitted  # forgets the first
    back = NOW + 301 - HOUR  # every clock went back an hour
    verdict = checker.verify(preamble(back), back)
    assert verdict.admitted, verdict
    assert checker.stepped_back == pytest.approx(HOUR - 1)


def test_a_nonce_still_remembered_stays_refused_after_the_clock_went_back() -> None:
    checker = gate()
    sent = preamble(NOW)
    assert checker.verify(sent, NOW).admitted
    assert checker.verify(sent, NOW - 60).refusal is Refusal.REPLAYED
    assert checker.stepped_back == pytest.approx(60)


@pytest.mark.parametrize("step", [-HOUR, HOUR, DAY])
def test_the_listeners_clock_stepping_refuses_the_others_until_it_is_right(
    step: float,
) -> None:
    """Only this seed's clock steps: every preamble is stale, with the offset (the log line
    and GET /cluster say it); once NTP sets it right they are admitted again."""
    checker = gate()
    assert checker.verify(preamble(NOW), NOW).admitted
    verdict = checker.verify(preamble(NOW + 1), NOW + 1 + step)
    assert verdict.refusal is Refusal.STALE
    assert verdict.skew == pytest.approx(-step)
    assert checker.verify(preamble(NOW + 2), NOW + 2).admitted


@pytest.mark.parametrize(("apart", "admitted"), [(2.0, True), (119.0, True),
                                                 (121.0, False), (2 * HOUR, False)])
def test_two_seeds_whose_clocks_differ_from_the_start(apart: float, admitted: bool) -> None:
    for skew in (apart, -apart):
        verdict = gate().verify(preamble(NOW + skew), NOW)
        assert verdict.admitted is admitted
        assert verdict.skew == pytest.approx(skew)


def test_the_nonces_kept_are_bounded_and_the_forgotten_stay_refused() -> None:
    checker = gate(max_nonces=8)
    sent = [preamble(NOW + i / 1000) for i in range(20)]
    for i, one in enumerate(sent):
        assert checker.verify(one, NOW + i / 1000).admitted
        assert checker.remembered <= 8
    for one in sent:
        assert checker.verify(one, NOW + 0.02).refusal is Refusal.REPLAYED
    assert checker.verify(preamble(NOW + 0.03), NOW + 0.03).admitted


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=PREAMBLE_SIZE, max_size=PREAMBLE_SIZE))
def test_random_bytes_are_refused(data: bytes) -> None:
    assert not gate().verify(data, NOW).admitted
    labelled = LABEL + data[len(LABEL):]
    assert gate().verify(labelled, NOW).refusal is Refusal.BAD_MAC


@settings(max_examples=300, deadline=None)
@given(st.integers(0, PREAMBLE_SIZE * 8 - 1))
def test_any_flipped_bit_is_refused(bit: int) -> None:
    sent = bytearray(preamble())
    sent[bit // 8] ^= 1 << (bit % 8)
    assert not gate().verify(bytes(sent), NOW).admitted


def test_a_wrong_length_is_refused() -> None:
    sent = preamble()
    for data in (sent[:-1], sent + b"\x00", b""):
        assert gate().verify(data, NOW).refusal is Refusal.NOT_A_PREAMBLE


def read(data: bytes, sizes: list[int]) -> tuple[bytes | Refusal | None, int]:
    """Feed ``data`` to a reader in pieces of ``sizes`` (each cut to what it wants), as
    the front's recv does; the outcome and the bytes the reader took."""
    reader = PreambleReader()
    taken = 0
    outcome: bytes | Refusal | None = None
    for size in [*sizes, PREAMBLE_SIZE]:
        piece = data[taken : taken + min(max(size, 1), reader.wanted)]
        if not piece:
            break
        taken += len(piece)
        outcome = reader.receive(piece)
        if outcome is not None:
            break
    return outcome, taken


def test_the_reader_whole_byte_by_byte_and_with_bytes_after() -> None:
    sent = preamble()
    assert read(sent, [PREAMBLE_SIZE]) == (sent, PREAMBLE_SIZE)
    assert read(sent, [1] * PREAMBLE_SIZE) == (sent, PREAMBLE_SIZE)
    assert read(sent + b"pysyncobj's bytes", [PREAMBLE_SIZE]) == (sent, PREAMBLE_SIZE)


@given(st.binary(min_size=PREAMBLE_SIZE, max_size=PREAMBLE_SIZE * 2),
       st.lists(st.integers(1, PREAMBLE_SIZE), max_size=PREAMBLE_SIZE))
def test_the_reader_never_takes_a_byte_past_the_preamble(data: bytes, sizes: list[int]) -> None:
    outcome, taken = read(data, sizes)
    assert taken <= PREAMBLE_SIZE
    if data.startswith(LABEL):
        assert outcome == data[:PREAMBLE_SIZE]
    else:
        assert outcome is Refusal.NOT_A_PREAMBLE
        first_wrong = next(i for i in range(len(LABEL)) if data[i] != LABEL[i])
        assert read(data, [1] * PREAMBLE_SIZE) == (outcome, first_wrong + 1)
    whole, _ = read(data, [PREAMBLE_SIZE])
    assert whole == outcome


def test_garbage_is_refused_at_its_first_byte() -> None:
    assert PreambleReader().receive(b"G") is Refusal.NOT_A_PREAMBLE
    reader = PreambleReader()
    assert reader.receive(LABEL[:3]) is None
    assert reader.receive(b"X") is Refusal.NOT_A_PREAMBLE


def test_the_reader_refuses_misuse() -> None:
    reader = PreambleReader()
    with pytest.raises(ValueError):
        reader.receive(b"")
    with pytest.raises(ValueError):
        reader.receive(bytes(PREAMBLE_SIZE + 1))
