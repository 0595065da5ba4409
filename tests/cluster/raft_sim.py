"""Real pysyncobj nodes on a simulated network and clock, driven one step at a time.

Every node is a real ``SyncObj`` (or :class:`~cluster.raft_follower.FollowerSafeSyncObj`)
with ``autoTick=False`` and its Raft log in a real file journal; only the network and
the clock are simulated. A test decides when each node ticks, when time passes, which
message is delivered next on which link, when a link breaks (losing what was in flight),
and when a node crashes (as by SIGKILL: journal and dump stay) and restarts from them.
Nothing runs in the background: a schedule replays exactly, and hypothesis shrinks it.

With ``compaction_entries`` set, every node compacts its log as the seeds do, only
sooner: once it holds more entries than that, it writes its state to its dump file
(``useFork=False``: at the end of the tick, synchronously) and trims its journal at its
next tick (a crash in between leaves both). A leader then sends its dump, in parts of
``dump_part_bytes``, to a follower behind the start of its log, and the follower jumps
to the dump's last entry (InstallSnapshot): the entries in between are never applied
one by one there; the dump carries the state they made.

Sending costs time there (``send_seconds`` per message, on the one clock): pysyncobj's
leader keeps sending to a follower until ``appendEntriesPeriod`` has passed, and while its
dump is being written (until its next tick here) it tells a follower that needs it so,
``serialized: None``, again and again: with a clock that never moved, that loop would
never end.

:class:`RaftWorld` also records what the Raft safety argument is about: every entry a
node has committed, every command a node has applied, every command acknowledged to
its submitter, every entry a leader holds (in its log, or in its state once compacted)
and sends, the state every loaded dump carries, and every log line at WARNING or above;
:meth:`RaftWorld.violations` lists what broke a safety property."""

from __future__ import annotations

import contextlib
import logging
import pickle
import random
import shutil
import tempfile
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pysyncobj.syncobj as syncobj_module
from pysyncobj import FAIL_REASON, SyncObjConf
from pysyncobj.transport import Transport
from raft_sim_node import Clock, LogCapture, Recorder, command_value

import cluster.raft_follower as raft_follower_module
from cluster import raft_compaction

LEADER_STATE = 2
LOGGERS = ("pysyncobj", "migratory.raft")


class SimTransport(Transport):  # type: ignore[misc]
    """One node's end of the simulated network (bound to a world by :meth:`bound`)."""

    world: RaftWorld

    @classmethod
    def bound(cls, world: RaftWorld) -> type[SimTransport]:
        return type("BoundSimTransport", (cls,), {"world": world})

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        self.address = selfNode.id
        self.peers = {node.id: node for node in otherNodes}

    port_held = False
    """Another process holds this node's port: not ready (pysyncobj's tick then only
    applies committed entries). Set once the node is built (:meth:`RaftWorld.hold_port`):
    ``SyncObj.__init__`` without autoTick waits for a ready transport."""

    @property
    def ready(self) -> bool:
        return not self.port_held

    def send(self, node: Any, message: Any) -> bool:
        return self.world.send(self.address, node.id, message)

    def link_up(self, node: Any) -> bool:
        """Whether :meth:`send` would deliver (cluster/raft_forward.py asks first)."""
        return (self.address, node.id) in self.world.queues


class RaftWorld:
    """``size`` Raft nodes at 127.0.0.1:1, :2, ... ; ``follower_class`` is the class every
    node runs (a node is leader and follower over its life, as in a real cluster)."""

    def __init__(
        self,
        size: int = 3,
        *,
        node_class: type[Any] = raft_follower_module.FollowerSafeSyncObj,
        batch_bytes: int = 2**16,
        seed: int = 0,
        compaction_entries: int | None = None,
        compaction_bytes: int = 0,
        dump_part_bytes: int = 2**16,
        send_seconds: float = 0.0,
    ) -> None:
        """``seed`` seeds the election timeouts (pysyncobj draws them from ``random``);
        ``compaction_entries`` (None: never), ``compaction_bytes`` (the log's byte bound,
        ClusterLogCompactionBytes; 0: none), ``dump_part_bytes`` and ``send_seconds``
        (which compaction needs), see above."""
        if (compaction_entries is not None or compaction_bytes) and send_seconds <= 0:
            raise ValueError("with compaction, sending must cost time (send_seconds)")
        self._random_state = random.getstate()
        random.seed(seed)
        self.addresses = [f"127.0.0.1:{i + 1}" for i in range(size)]
        self.node_class = node_class
        self.batch_bytes = batch_bytes
        self.compaction_entries = compaction_entries
        self.compaction_bytes = compaction_bytes
        self.dump_part_bytes = dump_part_bytes
        self.send_seconds = send_seconds
        self.clock = Clock()
        self._patches = [
            (syncobj_module, "monotonicTime", self.clock),
            (raft_follower_module, "monotonicTime", self.clock),
            (syncobj_module, "PIPE_NOTIFIER_ENABLED", False),  # no pipe per node, no wake-up
        ]
        self._saved = [(module, name, getattr(module, name)) for module, name, _ in self._patches]
        for module, name, value in self._patches:
            setattr(module, name, value)
        self.logs = LogCapture()
        for logger in LOGGERS:
            logging.getLogger(logger).addHandler(self.logs)
        # the journals are real files (in memory when the machine has a tmpfs)
        shm = Path("/dev/shm")
        self.dir = Path(tempfile.mkdtemp(prefix="raft-sim-", dir=shm if shm.is_dir() else None))
        self.nodes: dict[str, Any] = {}
        self.recorders: dict[str, Recorder] = {}
        self.links_down: set[frozenset[str]] = set()
        self.queues: dict[tuple[str, str], deque[Any]] = {}
        # what the safety checks look at
        self.committed: dict[int, tuple[int, bytes]] = {}  # index -> (term, command)
        # index -> the lowest current term of a node seen holding it committed: every
        # leader of that term or later must hold the entry (Leader Completeness)
        self.commit_term: dict[int, int] = {}
        self._values: dict[int, bytes | None] = {}  # index -> its committed command's value
        self._states: dict[str, tuple[list[tuple[int, bytes]], int, dict[int, bytes]]] = {}
        self.checked_commit: dict[str, int] = {}
        self.applied: dict[int, bytes] = {}  # index -> value, on any node
        self.acknowledged: dict[bytes, int] = {}  # value -> index told to its submitter
        self.problems: list[str] = []
        self.sent_entries = 0
        self.dump_parts_sent = 0
        self.dumps_installed = 0  # a leader's, loaded by a follower
        self.dumps_reloaded = 0  # a node's own, at start-up
        # per node, since its last start: ("applied", index) and ("restored", the index
        # its loaded dump ends at), in order
        self.lives: dict[str, list[tuple[str, int]]] = {}
        self._receiving: str | None = None  # the node handling a message
        try:
            for address in self.addresses:
                self.start(address)
        except BaseException:
            self.close()  # undo the patches
            raise

    # --- nodes --------------------------------------------------------------------------

    def start(self, address: str) -> None:
        assert address not in self.nodes
        conf = SyncObjConf(
            autoTick=False,
            appendEntriesUseBatch=False,  # as cluster/raft.py runs it
            raftMinTimeout=0.15,
            raftMaxTimeout=0.30,
            appendEntriesPeriod=0.04,
            leaderFallbackTimeout=1.2,
            commandsWaitLeader=True,
            appendEntriesBatchSizeBytes=self.batch_bytes,
            journalFile=str(self.dir / f"{address.replace(':', '_')}.journal"),
            fullDumpFile=str(self.dir / f"{address.replace(':', '_')}.dump"),
            logCompactionMinEntries=self.compaction_entries or 10**9,
            logCompactionMinTime=10**9,
            logCompactionBatchSize=self.dump_part_bytes,
            useFork=False,
        )
        raft_compaction.bound_log_bytes(conf, self.compaction_bytes)
        life = self.lives[address] = []
        recorder = Recorder(
            lambda index, value: (life.append(("applied", index)),
                                  self._applied(address, index, value)),
            lambda applied: (life.append(("restored", max((i for i, _ in applied), default=0))),
                             self._restored(address, applied)),
        )
        others = [a for a in self.addresses if a != address]
        node = self.node_class(
            address, others, conf=conf, consumers=[recorder],
            transportClass=SimTransport.bound(self),
        )
        self.nodes[address] = node
        self.recorders[address] = recorder
        self.checked_commit[address] = 0
        for other in others:
            if other in self.nodes and not self.link_down(address, other):
                self._connect(address, other)

    def crash(self, address: str) -> None:
        """As SIGKILL: in-flight messages are lost, the journal on disk stays."""
        node = self.nodes.pop(address)
        for other in self.addresses:
            if other != address and other in self.nodes:
                self._disconnect(address, other)
        node._SyncObj__raftLog._destroy()

    def restart(self, address: str) -> None:
        self.start(address)

    def lose_disk(self, address: str) -> None:
        """SIGKILL (if up), every file of the node deleted (journal, its meta, dump,
        marker), restart: a lost ClusterDataDir."""
        if address in self.nodes:
            self.crash(address)
        for path in self.dir.glob(address.replace(":", "_") + ".*"):
            path.unlink()
        self.start(address)

    def hold_port(self, address: str, held: bool = True) -> None:
        """Another process holds (or no longer holds) ``address``'s port."""
        self.nodes[address]._SyncObj__transport.port_held = held

    def tick(self, address: str) -> None:
        node = self.nodes[address]
        node.doTick(0.0)
        self._check_node(address)

    def tick_all(self) -> None:
        for address in list(self.nodes):
            self.tick(address)

    def leader(self) -> str | None:
        leaders = [a for a, n in self.nodes.items() if n._SyncObj__raftState == LEADER_STATE]
        return max(leaders, key=lambda a: self.nodes[a].raftCurrentTerm) if leaders else None

    def submit(self, address: str, value: bytes) -> None:
        def done(result: Any, error: int) -> None:
            if error == FAIL_REASON.SUCCESS:
                self.acknowledged[value] = result
                self._expect(self.applied.get(result, value) == value,
                             f"{value!r} acknowledged at {result}, applied there: "
                             f"{self.applied.get(result)!r}")

        self.recorders[address].put(value, callback=done)

    # --- network ------------------------------------------------------------------------

    def link_down(self, a: str, b: str) -> bool:
        return frozenset((a, b)) in self.links_down

    def _connect(self, a: str, b: str) -> None:
        self.queues[(a, b)] = deque()
        self.queues[(b, a)] = deque()
        for me, other in ((a, b), (b, a)):
            transport = self.nodes[me]._SyncObj__transport
            transport._onNodeConnected(transport.peers[other])

    def _disconnect(self, a: str, b: str) -> None:
        self.queues.pop((a, b), None)
        self.queues.pop((b, a), None)
        for me, other in ((a, b), (b, a)):
            if me in self.nodes:
                transport = self.nodes[me]._SyncObj__transport
                transport._onNodeDisconnected(transport.peers[other])

    def cut(self, a: str, b: str) -> None:
        """Partition a from b (both directions) until :meth:`heal`."""
        if a == b or self.link_down(a, b):
            return
        self.links_down.add(frozenset((a, b)))
        if a in self.nodes and b in self.nodes:
            self._disconnect(a, b)

    def heal(self, a: str, b: str) -> None:
        if not self.link_down(a, b):
            return
        self.links_down.discard(frozenset((a, b)))
        if a in self.nodes and b in self.nodes:
            self._connect(a, b)

    def reset(self, a: str, b: str) -> None:
        """A TCP connection breaks and is re-made: what was in flight is lost."""
        if (a, b) in self.queues:
            self._disconnect(a, b)
            self._connect(a, b)

    def send(self, source: str, target: str, message: Any) -> bool:
        self.clock.now += self.send_seconds
        queue = self.queues.get((source, target))
        if queue is None:
            return False
        if message.get("type") == "append_entries":
            self._check_sent(source, message)
            self.dump_parts_sent += message.get("serialized") is not None
        queue.append(pickle.dumps(message))
        return True

    def deliver(self, source: str, target: str, count: int = 1) -> int:
        """Deliver up to ``count`` messages in order from source to target (the target
        is checked after each: what one message does may be undone by the next)."""
        done = 0
        queue = self.queues.get((source, target))
        while queue and done < count:
            message = pickle.loads(queue.popleft())
            transport = self.nodes[target]._SyncObj__transport
            self._receiving = target
            try:
                transport._onMessageReceived(transport.peers[source], message)
            except Exception:  # as pysyncobj's tick thread: log it and carry on
                logging.getLogger("pysyncobj.syncobj").exception(
                    "failed _onTick in _autoTickThread"
                )
            finally:
                self._receiving = None
            done += 1
            self._check_node(target)
        send_held = getattr(self.nodes.get(target), "_send_held_answers", None)
        if done and send_held is not None:  # the end of its poll (cluster/raft_held_answers)
            self._receiving = target
            try:
                send_held()
            finally:
                self._receiving = None
            self._check_node(target)
        return done

    def deliver_all(self) -> int:
        total = 0
        for source, target in list(self.queues):
            total += self.deliver(source, target, 10**9)
        return total

    def pending(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def step(self, seconds: float) -> None:
        """Time passes, every node ticks, every message in flight arrives."""
        self.clock.now += seconds
        self.tick_all()
        while self.deliver_all():
            pass

    def heal_all(self) -> None:
        for a, b in sorted(sorted(link) for link in self.links_down):  # an order of its own
            self.heal(a, b)
        for address in self.addresses:
            if address not in self.nodes:
                self.restart(address)

    # --- what is checked ----------------------------------------------------------------

    def _expect(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(problem)

    def _applied(self, address: str, index: int, value: bytes) -> None:
        before = self.applied.setdefault(index, value)
        self._expect(before == value, f"{address} applied {value!r} at {index}, another "
                     f"node applied {before!r} there: state machines diverged")
        told = self.acknowledged.get(value)
        self._expect(told in (None, index), f"{value!r} acknowledged at {told}, {address} "
                     f"applied it at {index}")
        entry = self.committed.get(index)
        self._expect(entry is None or command_value(entry[1]) == value,
                     f"{address} applied {value!r} at {index}, committed there: {entry}")

    def _restored(self, address: str, applied: list[tuple[int, bytes]]) -> None:
        """``address`` loaded a dump: its state holds the commands applied up to the
        dump's last entry, those it never applied itself included. Each must be the
        one applied (and committed, and acknowledged) at its index everywhere."""
        if self._receiving == address:
            self.dumps_installed += 1
        else:
            self.dumps_reloaded += 1
        for index, value in applied:
            self._applied(address, index, value)

    def _check_node(self, address: str) -> None:
        """Record what ``address`` has committed; a leader's log must hold every entry
        committed in its term or before (Leader Completeness)."""
        node = self.nodes.get(address)
        if node is None:
            return
        commit, term = node.raftCommitIndex, node.raftCurrentTerm
        # A restarted node may apply further than the commit index it reloads (its dump
        # is newer than the commit index in its journal's meta, which pysyncobj stores
        # lazily); what must not happen is the commit index falling below what was applied
        if commit < self.checked_commit[address] and node.raftLastApplied > commit:
            self._expect(False, f"{address} applied up to {node.raftLastApplied} but its "
                         f"commit index fell to {commit}")
        leading = node._SyncObj__raftState == LEADER_STATE
        if commit <= self.checked_commit[address] and not leading:
            return  # (nothing newly committed to record, no leader to check: most messages)
        log = {index: (term, command) for command, index, term in node._SyncObj__raftLog[:]}
        for index in range(self.checked_commit[address] + 1, commit + 1):
            if index not in log:
                continue
            before = self.committed.setdefault(index, log[index])
            if before != log[index]:
                self._expect(False, f"{address} committed {log[index][0]}:"
                             f"{log[index][1][:12]!r} at {index}, {before[0]}:"
                             f"{before[1][:12]!r} was committed there")
            self.commit_term[index] = min(self.commit_term.get(index, term), term)
        self.checked_commit[address] = max(self.checked_commit[address], commit)
        if leading:
            self._check_leader(address, log)

    def _check_leader(self, address: str, log: dict[int, tuple[int, bytes]]) -> None:
        """A leader holds every entry committed in its term or before: in its log, or, below
        the start of its compacted log, in the state it applied (its dump's)."""
        node, first = self.nodes[address], min(log)
        term, state = node.raftCurrentTerm, None
        for index, entry in self.committed.items():
            if self.commit_term[index] > term:
                continue
            if index >= first:
                held: object = log.get(index)
                if held == entry:
                    continue
            else:
                state = self._state(address) if state is None else state
                if index not in self._values:  # (committed entries never change)
                    self._values[index] = command_value(entry[1])
                if index <= node.raftLastApplied and state.get(index) == self._values[index]:
                    continue
                held = f"{state.get(index)!r} in its state (applied up to {node.raftLastApplied})"
            # (the problem's text made only for a problem: it was most of a schedule's CPU)
            self._expect(False, f"leader {address} of term {term} holds {held} at index "
                         f"{index}, committed by term {self.commit_term[index]}: {entry}")

    def _state(self, address: str) -> dict[int, bytes]:
        """``dict(recorder.applied)``, brought up to date from where it was (the list only
        grows, or a dump replaces it whole), not built anew at each check of a leader."""
        applied = self.recorders[address].applied
        kept, done, state = self._states.get(address, (None, 0, {}))
        if kept is not applied or done > len(applied):
            done, state = 0, {}
        state.update(applied[done:])
        self._states[address] = (applied, len(applied), state)
        return state

    def _check_sent(self, source: str, message: dict[str, Any]) -> None:
        """No AppendEntries of a term at or after an entry's commit carries a different
        entry at its index."""
        for command, index, term in message.get("entries", ()):
            self.sent_entries += 1
            entry = self.committed.get(index)
            if entry is not None and self.commit_term[index] <= message["term"]:
                self._expect(entry == (term, command),
                             f"{source} (term {message['term']}) sent entry {index} of term "
                             f"{term} over the entry of term {entry[0]} committed there")

    def critical_lines(self) -> list[str]:
        return [r.getMessage() for r in self.logs.records if r.levelno >= logging.ERROR]

    def violations(self) -> list[str]:
        return self.problems + [f"logged: {line}" for line in self.critical_lines()]

    def converged(self) -> bool:
        """Every live node has applied every acknowledged command."""
        for recorder in self.recorders.values():
            values = {value for _, value in recorder.applied}
            if not set(self.acknowledged) <= values:
                return False
        return True

    def close(self) -> None:
        """Crash every node, remove the journals, undo the patches."""
        for address in list(self.nodes):
            self.crash(address)
        shutil.rmtree(self.dir, ignore_errors=True)
        for logger in LOGGERS:
            logging.getLogger(logger).removeHandler(self.logs)
        for module, name, value in self._saved:
            setattr(module, name, value)
        random.setstate(self._random_state)


@contextlib.contextmanager
def simulated(size: int = 3, **kw: Any) -> Iterator[RaftWorld]:
    world = RaftWorld(size, **kw)
    try:
        yield world
    finally:
        world.close()
