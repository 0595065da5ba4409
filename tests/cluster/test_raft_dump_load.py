"""A seed's Raft thread loading a dump (``CoordinationConsumer._deserialize``) builds no
``Message``: it copies the dump's caches as they stand, packed, and the member builds
each subject's record when it installs it, a slice at a time. It was ~0.7 s of the Raft
thread for 660,000 cached messages and ~3 s for a million subjects (docs/benchmarks.md),
seconds in which it missed heartbeats and elections."""

from __future__ import annotations

import gc
import pickle
import threading
import time

from cluster.cache_sync import CacheSync, SyncInstall
from cluster.coordination import UNNUMBERED_EPOCH
from cluster.raft import CoordinationConsumer, WireRequest
from migratory.model.message import Message
from migratory.server.hub import Hub

SUBJECTS = 20


def batch(n: int) -> list[WireRequest]:
    """Batch ``n``: five publishes over the subjects, the first retained (snapshots)."""
    return [
        ("m#1", 5 * n + i, f"/dump/{(5 * n + i) % SUBJECTS}", b"c%d" % (5 * n + i),
         {"n": str(5 * n + i)}, i == 0, True)
        for i in range(5)
    ]


def messages_alive() -> int:
    gc.collect()
    return sum(isinstance(o, Message) for o in gc.get_objects())


def test_loading_a_dump_builds_no_message_on_the_raft_thread() -> None:
    writer = CoordinationConsumer(lambda batch: None)
    for n in range(40):  # 200 messages over 20 subjects
        writer.commit_batch(7, batch(n), _doApply=True)
    dump = pickle.dumps(writer._serialize())  # what pysyncobj writes (and sends)
    handed: list[CacheSync] = []
    built_on_raft_thread: list[int] = []
    alive: list[int] = []

    def on_restore(sync: CacheSync) -> None:
        while not sync.subjects.ready():  # type: ignore[attr-defined]
            time.sleep(0.01)  # the dump's caches decode in a thread of their own
        built_on_raft_thread.append(messages_alive() - alive[0])
        handed.append(sync)

    reader = CoordinationConsumer(lambda batch: None, on_restore)

    def raft_thread() -> None:
        alive.append(messages_alive())
        state = pickle.loads(dump)
        reader._deserialize(state)
        for n in range(40, 60):  # the Raft thread goes on with the caches it handed over
            reader.commit_batch(7, batch(n), _doApply=True)

    thread = threading.Thread(target=raft_thread, name="raft")
    thread.start()
    thread.join()
    # the dump's 4 snapshots (decoded off the Raft thread since cluster/dump_decoder.py)
    assert built_on_raft_thread == [4]  # before: 204, every cached message too

    (sync,) = handed
    hub = Hub(epoch=UNNUMBERED_EPOCH, numbered_elsewhere=True)
    install = SyncInstall(hub, sync.subjects, sync.clsn)
    slices = 1
    while not install.step(0.0, budget=25):
        slices += 1
    assert slices > 5
    # the state of the dump, not the one after the batches the Raft thread applied later
    expected = writer.cache.to_sync(writer.coordinator.clsn, writer.coordinator.positions())
    assert sync.clsn == 40 and len(expected.subjects) == SUBJECTS
    held = {subject: (position, snapshot, run.messages())
            for subject, position, snapshot, run in hub.numbered()}
    for record in expected.subjects:
        position, snapshot, cached = held[record.subject]
        assert position == record.position
        assert snapshot == record.snapshot
        assert [(m.seq, m.content, m.fields) for m in cached] == [
            (m.seq, m.content, m.fields) for m in record.cached
        ]
        assert len(cached) == 10
    assert sum(record.snapshot is not None for record in expected.subjects) == 4
