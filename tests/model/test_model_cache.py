import gc
from collections import deque
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from migratory.model.cache import SubjectCache, encoded_bound
from migratory.model.message import Message

SUBJECT = "/Stocks/NYSE/IBM"


def msg(seq: int, epoch: int = 1) -> Message:
    return Message(SUBJECT, str(seq).encode(), epoch=epoch, seq=seq)


def filled(first: int, last: int, **kwargs: object) -> SubjectCache:
    cache = SubjectCache(last_seq_seen=first - 1, **kwargs)  # type: ignore[arg-type]
    for seq in range(first, last + 1):
        cache.append(msg(seq), now=float(seq))
    return cache


def seqs(messages: list[Message] | None) -> list[int] | None:
    return None if messages is None else [m.seq for m in messages]


def test_empty_fresh_cache() -> None:
    cache = SubjectCache()
    assert len(cache) == 0
    assert cache.first_seq is None and cache.last_seq is None
    assert cache.last_seq_seen == 0
    assert cache.since(0) == []
    assert cache.since(1) is None
    assert cache.last(5) == []


def test_count_cap_drops_oldest() -> None:
    cache = filled(1, 10, max_messages=4)
    assert len(cache) == 4
    assert (cache.first_seq, cache.last_seq) == (7, 10)
    assert seqs(cache.last(100)) == [7, 8, 9, 10]


def test_zero_capacity_still_tracks_last_seq() -> None:
    cache = filled(1, 3, max_messages=0)
    assert len(cache) == 0
    assert cache.last_seq_seen == 3
    assert cache.since(3) == []
    assert cache.since(2) is None


def test_expiry_with_explicit_clock() -> None:
    cache = SubjectCache(expire_seconds=180.0)
    cache.append(msg(1), now=1000.0)
    cache.append(msg(2), now=1060.0)
    cache.append(msg(3), now=1120.0)
    assert cache.expire(now=1180.0) == 0  # exactly 180 s old: kept
    assert cache.expire(now=1180.5) == 1
    assert cache.first_seq == 2
    assert cache.expire(now=2000.0) == 2
    assert len(cache) == 0
    assert cache.last_seq_seen == 3
    assert cache.since(3) == []
    assert cache.since(2) is None
    assert cache.since(4) is None
    cache.append(msg(4), now=2001.0)
    assert seqs(cache.since(3)) == [4]


@pytest.mark.parametrize(
    ("seq", "expected"),
    [
        (0, None),  # first_seq 5 > 0 + 1
        (3, None),  # first_seq 5 > 3 + 1
        (4, [5, 6, 7, 8]),  # reaches back exactly
        (5, [6, 7, 8]),
        (7, [8]),
        (8, []),  # up to date
        (9, None),  # beyond last seq
        (100, None),
    ],
)
def test_since_boundaries(seq: int, expected: list[int] | None) -> None:
    cache = filled(5, 8)
    assert seqs(cache.since(seq)) == expected


def test_since_from_start_of_epoch() -> None:
    cache = filled(1, 3)
    assert seqs(cache.since(0)) == [1, 2, 3]


def test_since_negative_rejected() -> None:
    with pytest.raises(ValueError):
        SubjectCache().since(-1)


def test_last() -> None:
    cache = filled(1, 5)
    assert cache.last(0) == []
    assert cache.last(-3) == []
    assert seqs(cache.last(2)) == [4, 5]
    assert seqs(cache.last(5)) == [1, 2, 3, 4, 5]
    assert seqs(cache.last(50)) == [1, 2, 3, 4, 5]


def test_append_rejects_holes_and_repeats() -> None:
    cache = filled(1, 3)
    for bad in (3, 5, 1):
        with pytest.raises(ValueError, match="does not follow"):
            cache.append(msg(bad), now=9.0)
    assert cache.last_seq == 3


def test_append_rejects_hole_after_emptying() -> None:
    cache = filled(1, 3, expire_seconds=1.0)
    cache.expire(now=100.0)
    with pytest.raises(ValueError, match="does not follow"):
        cache.append(msg(5), now=100.0)


def test_append_rejects_other_epoch_and_seq_zero() -> None:
    cache = filled(1, 2)
    with pytest.raises(ValueError, match="epoch"):
        cache.append(msg(3, epoch=2), now=9.0)
    with pytest.raises(ValueError, match=">= 1"):
        SubjectCache().append(msg(0), now=0.0)


def test_first_append_may_start_anywhere_when_nothing_known() -> None:
    cache = SubjectCache()
    cache.append(msg(57), now=0.0)
    assert cache.since(56) == [msg(57)]
    assert cache.since(0) is None


def test_reset_starts_a_new_epoch() -> None:
    cache = filled(1, 3)
    cache.reset()
    assert len(cache) == 0 and cache.last_seq_seen == 0
    assert cache.since(0) == []
    cache.append(msg(1, epoch=2), now=10.0)
    assert seqs(cache.since(0)) == [1]


@pytest.mark.parametrize(
    "make",
    [
        lambda: SubjectCache(max_messages=-1),
        lambda: SubjectCache(expire_seconds=-1.0),
        lambda: SubjectCache(last_seq_seen=-1),
    ],
)
def test_constructor_validation(make: Callable[[], SubjectCache]) -> None:
    with pytest.raises(ValueError):
        make()


operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.floats(0, 5)),
        st.tuples(st.just("expire"), st.floats(0, 5)),
        st.tuples(st.just("reset"), st.just(0.0)),
    ),
    max_size=60,
)


@given(
    st.integers(0, 6),
    st.floats(0, 10),
    st.integers(0, 3),
    operations,
)
def test_matches_list_model(
    max_messages: int,
    expire_seconds: float,
    start_seq: int,
    ops: list[tuple[str, float]],
) -> None:
    cache = SubjectCache(
        max_messages=max_messages, expire_seconds=expire_seconds, last_seq_seen=start_seq
    )
    model: list[tuple[float, Message]] = []
    last_seen = start_seq
    now = 0.0
    for op, dt in ops:
        now += dt
        if op == "append":
            last_seen += 1
            message = msg(last_seen)
            cache.append(message, now)
            model = [*model, (now, message)][-max_messages:] if max_messages else []
        elif op == "expire":
            kept = [(t, m) for t, m in model if now - t <= expire_seconds]
            assert cache.expire(now) == len(model) - len(kept)
            model = kept
        else:
            cache.reset()
            model, last_seen = [], 0
        messages = [m for _, m in model]
        assert len(cache) == len(model)
        assert cache.bytes == sum(encoded_bound(m) for m in messages)
        assert cache.last_seq_seen == last_seen
        assert cache.first_seq == (messages[0].seq if messages else None)
        assert cache.last_seq == (messages[-1].seq if messages else None)
        for seq in range(last_seen + 3):
            expected: list[Message] | None
            if seq > last_seen:
                expected = None
            elif not messages:
                expected = [] if seq == last_seen else None
            elif messages[0].seq > seq + 1:
                expected = None
            else:
                expected = [m for m in messages if m.seq > seq]
            assert cache.since(seq) == expected, seq
        for n in range(-1, len(messages) + 2):
            assert cache.last(n) == (messages[-n:] if n > 0 else [])


def test_a_one_message_cache_holds_no_deque() -> None:
    """A one-off subject's cache is one object for the collector (issue 14: 200,000
    one-off subjects were 600,000 tracked objects, a full collection ~150 ms)."""
    cache = SubjectCache(max_messages=10, expire_seconds=5)
    cache.append(msg(1), now=0.0)
    gc.collect()  # untracks a tuple of atoms (the entry) the first time it sees it
    held = [r for r in gc.get_referents(cache) if not isinstance(r, type)]
    assert not [r for r in held if gc.is_tracked(r)]
    cache.append(msg(2), now=1.0)
    assert [r for r in gc.get_referents(cache) if isinstance(r, deque)]
    assert cache.expire(10.0) == 2
    assert not [r for r in gc.get_referents(cache) if isinstance(r, deque)]  # it went


def test_a_cached_message_with_fields_is_untracked_by_two_young_collections() -> None:
    """Fields are kept flat, so an entry is untracked by its second collection -- the
    generation-1 one, before it reaches the old generation (fields as pairs needed three,
    and a wrapper around the entry a fourth)."""
    cache = SubjectCache(max_messages=10, expire_seconds=5)
    message = Message("/a/b", b"x", {"n": "1", "m": "2"}, epoch=3, seq=1)
    cache.append(message, now=0.0)
    gc.collect(0)  # the collector reaches the fields through the entry: they go first
    gc.collect(1)
    (entry,) = [r for r in gc.get_referents(cache) if isinstance(r, tuple)]
    assert entry[3] == "/a/b"  # the entry itself, no wrapper around it
    assert not gc.is_tracked(entry)
    assert cache.last(1) == [message]


@pytest.mark.parametrize("max_messages", [0, 1, 2, 3])
def test_append_says_how_much_the_cache_grew(max_messages: int) -> None:
    """The hub counts cached messages from what append returns (no len() before and after)."""
    cache = SubjectCache(max_messages=max_messages)
    for seq in range(1, 6):
        before = len(cache)
        assert cache.append(msg(seq), 0.0) == len(cache) - before


def test_a_message_without_fields_is_stored_as_any_other_and_read_back_whole() -> None:
    # append writes the entry of a message without fields out inline; every kind of one
    # must come back the message it was, and count its encoded bound
    from migratory.model.cache import _entry
    from migratory.model.message import MessageType, Qos

    cache = SubjectCache(max_messages=10)
    messages = [
        Message(SUBJECT, b"a", epoch=7, seq=1),
        Message(SUBJECT, b"b", {"k": "v"}, epoch=7, seq=2),
        Message(SUBJECT, b"c", retained=True, qos=Qos.GUARANTEED, closure="c3", epoch=7,
                seq=3, type=MessageType.SNAPSHOT),
        Message("/é/ü", b"\xff" * 300, closure="c4", epoch=7, seq=4),
    ]
    for now, message in enumerate(messages):
        cache.append(message, float(now))
        assert cache._all[-1] == _entry(message, float(now))
    assert cache.last(10) == messages
    assert cache.bytes == sum(encoded_bound(m) for m in messages)


def test_a_cache_holding_a_peers_messages_keeps_them_as_updates_without_closure() -> None:
    from migratory.model.message import MessageType

    kinds = [MessageType.UPDATE, MessageType.RECOVERED, MessageType.UPDATE]
    closures = [None, None, "c-1"]
    cached = [
        Message("/a/b", b"%d" % seq, {}, epoch=4, seq=seq, type=kind, closure=closure)
        for seq, kind, closure in zip((1, 2, 3), kinds, closures, strict=True)
    ]
    cache = SubjectCache.holding(
        "/a/b", 4, 3, cached, 0.0, max_messages=10, expire_seconds=60, budget=None
    )
    held = cache.last(3)
    assert [m.content for m in held] == [b"1", b"2", b"3"]
    assert all(m.type is MessageType.UPDATE and m.closure is None for m in held)


def test_a_full_collection_walks_no_cached_message() -> None:
    """A seed's ~1.1 million cached entries, walked in their tracked deques, were ~100 ms
    of each ~155 ms full collection (issue 13): the deque of a subject's entries is not
    tracked, so the collector visits nothing of what the caches hold."""
    caches = [filled(1, 500, max_messages=1000) for _ in range(10)]
    gc.collect()
    held = [r for r in gc.get_referents(*caches) if not isinstance(r, type)]
    assert sum(isinstance(r, deque) for r in held) == 10
    walked = [r for r in held if gc.is_tracked(r)]
    assert sum(len(gc.get_referents(r)) for r in walked) == 0  # was 5,000: every entry
    assert [m.seq for m in caches[3].since(497) or []] == [498, 499, 500]
