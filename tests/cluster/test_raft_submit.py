"""Submitting from the trio thread while the Raft thread loads a dump.

pysyncobj 0.3.17 rebuilds its table of replicated-method names on every dump load
(empties it, then refills it) on the Raft thread; a submit looks a name up in it from
the calling thread. A seed's submit landing in between died with
``KeyError: (id, 'commit_batch')`` in a chaos run. These tests put the table in that
half-built state and submit.
"""

from __future__ import annotations

import threading
import time

import pytest
from listen_ports import listen_port, seed_port
from pysyncobj import SyncObj, SyncObjConf, SyncObjConsumer, replicated

from cluster.raft import RaftCoordination


class Counter(SyncObjConsumer):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.value = 0

    @replicated  # type: ignore[untyped-decorator]
    def add(self) -> int:
        self.value += 1
        return self.value


def raft_state(raft: RaftCoordination) -> dict[str, object]:
    """What a submit that never completes leaves to look at (it failed once in CI, not
    since): pysyncobj's own status, its transport, its queue and tick thread."""
    syncobj = raft.syncobj
    status = syncobj.getStatus()
    thread = getattr(syncobj, "_SyncObj__thread", None)
    return {
        "state": status.get("state"), "leader": status.get("leader"),
        "term": status.get("raft_term"), "has_quorum": status.get("has_quorum"),
        "commit_idx": status.get("commit_idx"), "last_applied": status.get("last_applied"),
        "transport_ready": syncobj._SyncObj__transport.ready,
        "queued_commands": len(syncobj._SyncObj__commandsQueue._FastQueue__queue),
        "tick_thread_alive": None if thread is None else thread.is_alive(),
        "names": dict(syncobj._SyncObj__currentVersionFuncNames),
    }


def test_pysyncobj_itself_fails_a_submit_while_its_names_are_rebuilt() -> None:
    """Why the override exists; if this fails, pysyncobj changed."""
    counter = Counter()
    syncobj = SyncObj(f"127.0.0.1:{listen_port()}", [], conf=SyncObjConf(autoTick=False),
                      consumers=[counter])
    try:
        syncobj._SyncObj__currentVersionFuncNames = {}  # mid-rebuild, as a dump loads
        with pytest.raises(KeyError):
            counter.add()
    finally:
        syncobj.destroy()


def test_a_submit_while_a_dump_loads_still_commits() -> None:
    port = seed_port()
    committed = []
    raft = RaftCoordination(
        self_address=("127.0.0.1", port), seed_addresses=[("127.0.0.1", port)],
        password="x", on_commit=committed.append,
    )
    try:
        raft.syncobj._SyncObj__currentVersionFuncNames = {}  # mid-rebuild, as a dump loads
        done = threading.Event()
        outcome: list[object] = []
        raft.submit(2, [], lambda clsn, error, unknown: (outcome.append((clsn, error)),
                                                           done.set()))
        assert done.wait(10), f"the submit never completed: {raft_state(raft)}"
        assert outcome == [(1, None)]
        deadline = time.monotonic() + 5
        while not committed and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [batch.clsn for batch in committed] == [1]
    finally:
        raft.close()
