"""One snapshot rule for a subject whose lineage changes (a new epoch): the hub that
applies the committed stream and the seeds' replicated cache (what a Raft dump and a
cache sync carry) both take the snapshot from ``merge_snapshot`` alone -- the seeds'
table "Examples of Snapshot Messages": the latest retained message with the fields of
all earlier ones merged in, an epoch being internal. Before, the replicated cache
dropped the snapshot at a new epoch while its queue held messages (and a sync left out a
snapshot of another epoch), where the hub kept merging: a member synced from a seed got
another snapshot than the seed's own hub served."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.replicated_cache import ReplicatedCache
from migratory.model.message import Message, MessageType, Qos
from migratory.server.hub import Hub

SUBJECTS = ("/a/b", "/c/d")

step = st.tuples(
    st.sampled_from(SUBJECTS),
    st.booleans(),  # a new epoch starts with this message
    st.booleans(),  # retained
    st.dictionaries(st.sampled_from(("bid", "ask", "volume")), st.sampled_from(("1", "2")),
                    max_size=2),
)


def stream(steps: list[tuple[str, bool, bool, dict[str, str]]]) -> list[Message]:
    """The committed messages: per subject seq + 1, or seq 1 of a new epoch."""
    positions: dict[str, tuple[int, int]] = {}
    messages = []
    for n, (subject, new_epoch, retained, fields) in enumerate(steps):
        epoch, seq = positions.get(subject, (10, 0))
        epoch, seq = (epoch + 1, 1) if new_epoch and seq else (epoch, seq + 1)
        positions[subject] = (epoch, seq)
        messages.append(Message(subject, b"m%d" % n, fields, retained, Qos.GUARANTEED, None,
                                epoch, seq, MessageType.UPDATE))
    return messages


def applied(messages: list[Message], max_cached: int) -> tuple[Hub, ReplicatedCache]:
    hub = Hub(epoch=1, numbered_elsewhere=True, max_cached_messages=max(max_cached, 1))
    cache = ReplicatedCache(max_messages=max_cached)
    for message in messages:
        hub.apply(message, 0.0)
        cache.append([message])
    return hub, cache


@settings(max_examples=200, deadline=None)
@given(st.lists(step, min_size=1, max_size=12), st.integers(0, 3))
def test_the_seeds_cache_and_the_hub_keep_one_snapshot(
    steps: list[tuple[str, bool, bool, dict[str, str]]], max_cached: int,
) -> None:
    hub, cache = applied(stream(steps), max_cached)
    positions = {s: (p.epoch, p.seq) for s in SUBJECTS if (p := hub.position(s)) is not None}
    synced = Hub(epoch=2, numbered_elsewhere=True)  # a member that installs the sync
    for record in cache.to_sync(len(steps), positions).subjects:
        assert record.snapshot == hub.snapshot(record.subject)
        synced.reposition(record.subject, record.position, record.snapshot, (), 0.0)
    for subject in positions:
        assert synced.snapshot(subject) == hub.snapshot(subject)


def test_a_new_epoch_merges_on_over_the_older_snapshot() -> None:
    """The table's rule across an epoch: a retained message of the new lineage over a
    snapshot with fields, and a non-retained one, the queue holding messages both times."""
    messages = stream([("/a/b", False, True, {"volume": "1"}), ("/a/b", True, True, {"bid": "2"}),
                       ("/a/b", True, False, {})])
    hub, cache = applied(messages, 3)
    (record,) = cache.to_sync(3, {"/a/b": (12, 1)}).subjects
    assert record.snapshot is not None
    assert record.snapshot.fields == {"volume": "1", "bid": "2"}
    assert (record.snapshot.content, record.snapshot.epoch) == (b"m1", 11)
    assert record.snapshot == hub.snapshot("/a/b")
