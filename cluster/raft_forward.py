"""A command a follower seed could not forward to the leader is held, not dropped.

A follower seed hands each command (a batch of publishes, an MQTT session save, a
barrier) to the Raft leader over its link. pysyncobj 0.3.17
(``SyncObj._checkCommandsToApply``) sends it with ``transport.send`` and ignores the
``False`` that says the link is down: the command is dropped, and its callback waits for
an answer that never comes -- until the leader changes (``LEADER_CHANGED``: outcome
unknown) or migratory's publish timeout (10 s, "outcome unknown"). With the leader
still leading (a link reset, one link of a partition) there is no leader change: every
publish through that seed waited the whole timeout and failed.

Refusing such a command at once (a66e4f7, reverted) was worse: at an ordinary failover
it freed the seed's one command slot at once, and every publish of the election window
was refused. Here the command is *held* (:class:`HoldsForwards`):

- held when, before anything is written, the link is down (:func:`link_up`, the test
  ``TCPTransport.send`` makes first) or pysyncobj's handshake on it is not done
  (:meth:`HoldsForwards._may_forward`): then no byte of it left this process, no leader
  can hold it. A send that fails *after* writing stays pysyncobj's: it may have
  arrived, its outcome is unknown (``LEADER_CHANGED`` later);
- a held command leaves pysyncobj's bookkeeping (its request id is removed from
  ``__commandsWaitingReply``, which no reply can ever match: it was never sent). When the
  link to the leader is up again -- the same leader, or a new one; or this seed leads
  now -- the held commands go back, oldest first and ahead of any newer command, into
  pysyncobj's own path: forwarded under a new request id, or appended by this leader.
  That is a first submission of a command no node has seen: its callback is called once,
  by pysyncobj as for any command. So a command held across a leader change commits
  under the new leader instead of failing ``LEADER_CHANGED`` (the failover of
  tests/cluster/test_cluster_mqtt_resume.py and test_cluster_sse_failover.py);
- never sent after its deadline: ``send_by`` on the callback (:class:`SendBy`; the seed
  sets it a margin before the publish timeout of the oldest publish in it,
  :func:`hold_deadline`), and at most :data:`MAX_HOLD_SECONDS` after it was held. Past
  it the command is dropped, never sent, and its callback gets :data:`NOT_SENT` (a
  definite failure: ``PUBLISH_FAILED`` "not published: LEADER_UNREACHABLE"), before the
  caller's own timeout could report it -- so a caller told its publish failed never sees
  it published later;
- at most :data:`MAX_HELD_COMMANDS` commands and :data:`MAX_HELD_BYTES` bytes held; one
  more is refused at once with :data:`NOT_SENT`.

:class:`ForwardHold` is the bookkeeping (pure, driven by tests with any clock);
:class:`HoldsForwards` the ``SyncObj`` mixin that feeds it. tests/cluster/
test_raft_forward.py (the hold), test_raft_forward_nodes.py (real pysyncobj nodes on
127.0.0.1) and test_raft_forward_sim.py (:mod:`raft_sim`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pysyncobj.syncobj as syncobj_module
from pysyncobj import SyncObj
from pysyncobj.syncobj import _RAFT_STATE
from pysyncobj.tcp_connection import CONNECTION_STATE

__all__ = [
    "MAX_HELD_BYTES", "MAX_HELD_COMMANDS", "MAX_HOLD_SECONDS", "NOT_SENT", "ForwardHold",
    "HoldsForwards", "SendBy", "hold_deadline", "link_up",
]

NOT_SENT = 100
"""The callback's error for a command never sent (no FAIL_REASON of pysyncobj's uses it):
the link to the leader stayed down past its deadline, or the hold was full."""
NOT_SENT_NAME = "LEADER_UNREACHABLE"
MAX_HOLD_SECONDS = 5.0
"""The longest a command is held, whatever its deadline: longer than an election and a
reconnection (~0.2-0.7 s, ``connectionRetryTime`` 0.3 s), half the publish timeout."""
HOLD_MARGIN = 1.0
"""Seconds before the caller's publish timeout after which a held command is not sent."""
MAX_HELD_COMMANDS = 1_000
MAX_HELD_BYTES = 32 << 20


def link_up(transport: Any, node: Any) -> bool:
    """Whether ``transport.send(node, ...)`` would write: ``TCPTransport.send``'s own test,
    made before it writes. A transport of another kind answers with its ``link_up``."""
    own = getattr(transport, "link_up", None)
    if own is not None:
        return bool(own(node))
    connection = transport._connections.get(node)
    return connection is not None and connection.state == CONNECTION_STATE.CONNECTED


def hold_deadline(
    *, now: float, oldest_submitted: float | None, publish_timeout: float, forwarded: bool
) -> float:
    """When (clock of ``now``) a held command of publishes must be given up, never sent.

    Own publishes: :data:`HOLD_MARGIN` before the oldest one's publish timeout (one that
    timed out already: now). A non-seed's (``forwarded``): their timeout runs on the
    non-seed, from before they were forwarded; half the timeout after their arrival."""
    if forwarded:
        return now + publish_timeout / 2
    if oldest_submitted is None:
        return now
    return min(now + publish_timeout, oldest_submitted + publish_timeout - HOLD_MARGIN)


class SendBy:
    """A pysyncobj callback that carries the time (``time.monotonic``) after which its
    command, if held, must never be sent."""

    __slots__ = ("call", "send_by")

    def __init__(self, call: Callable[[Any, int], None], send_by: float) -> None:
        self.call = call
        self.send_by = send_by

    def __call__(self, result: Any, error: int) -> None:
        self.call(result, error)


@dataclass(frozen=True, slots=True)
class Held:
    command: bytes
    callback: Callable[[Any, int], None] | None
    send_by: float
    size: int


@dataclass(slots=True)
class HoldStatistics:
    held: int = 0
    """Commands held because the link to the leader was down."""
    released: int = 0
    """Held commands handed back to pysyncobj once a leader was reachable."""
    expired: int = 0
    """Held commands dropped at their deadline, never sent (NOT_SENT)."""
    refused: int = 0
    """Commands refused at once, the hold being full (NOT_SENT)."""


class ForwardHold:
    """The commands held, oldest first, within count, bytes and age bounds."""

    def __init__(
        self,
        *,
        max_commands: int = MAX_HELD_COMMANDS,
        max_bytes: int = MAX_HELD_BYTES,
        max_seconds: float = MAX_HOLD_SECONDS,
    ) -> None:
        self.max_commands = max_commands
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds
        self._held: deque[Held] = deque()
        self._bytes = 0
        self.stats = HoldStatistics()

    def __len__(self) -> int:
        return len(self._held)

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def hold(self, command: bytes, callback: Callable[[Any, int], None] | None, now: float) -> bool:
        """Hold ``command``; False (nothing held) when the hold is full."""
        size = len(command)
        if len(self._held) >= self.max_commands or self._bytes + size > self.max_bytes:
            self.stats.refused += 1
            return False
        send_by = now + self.max_seconds
        own = getattr(callback, "send_by", None)
        if isinstance(own, float | int) and not math.isnan(own):
            send_by = min(send_by, float(own))
        self._held.append(Held(command, callback, send_by, size))
        self._bytes += size
        self.stats.held += 1
        return True

    def expire(self, now: float) -> list[Held]:
        """Remove and return the commands whose deadline has come (``now >= send_by``)."""
        if not any(now >= h.send_by for h in self._held):
            return []
        gone = [h for h in self._held if now >= h.send_by]
        self._held = deque(h for h in self._held if now < h.send_by)
        self._bytes -= sum(h.size for h in gone)
        self.stats.expired += len(gone)
        return gone

    def release(self, now: float) -> list[Held]:
        """Every command still within its deadline, oldest first, out of the hold (the
        expired ones first go by :meth:`expire`)."""
        taken = [h for h in self._held if now < h.send_by]
        self._held.clear()
        self._bytes = 0
        self.stats.released += len(taken)
        return taken

    def put_back(self, unsent: list[Held]) -> None:
        """Released commands pysyncobj did not take: back in front, in their order."""
        self._held.extendleft(reversed(unsent))
        self._bytes += sum(h.size for h in unsent)
        self.stats.released -= len(unsent)

    def statistics(self) -> dict[str, int]:
        s = self.stats
        return {
            "holding": len(self._held), "holding_bytes": self._bytes, "held": s.held,
            "released": s.released, "expired": s.expired, "refused": s.refused,
        }


class _ReleasedFirst:
    """pysyncobj's command queue, with the released held commands in front of it (for
    one ``_checkCommandsToApply``); a submit meanwhile goes to the queue itself."""

    def __init__(self, released: list[Held], queue: Any) -> None:
        self.released = deque(released)
        self.queue = queue

    def get_nowait(self) -> tuple[bytes, Any]:
        if self.released:
            held = self.released.popleft()
            return held.command, held.callback
        return self.queue.get_nowait()  # type: ignore[no-any-return]

    def put_nowait(self, value: Any) -> None:
        self.queue.put_nowait(value)


class HoldsForwards(SyncObj):  # type: ignore[misc]
    """A ``SyncObj`` whose follower holds a command it cannot forward (module docstring)."""

    _SyncObj__transport: Any
    _SyncObj__commandsWaitingReply: dict[Any, Any]
    _SyncObj__commandsQueue: Any
    _SyncObj__raftLeader: Any
    _SyncObj__raftState: int
    _SyncObj__connectedNodes: set[Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # before SyncObj.__init__: pysyncobj dumps every attribute set after it
        self.forward_hold = ForwardHold()
        super().__init__(*args, **kwargs)

    def _checkCommandsToApply(self) -> None:
        hold = self.forward_hold
        now = syncobj_module.monotonicTime()
        for held in hold.expire(now):
            if held.callback is not None:
                held.callback(None, NOT_SENT)
        released = hold.release(now) if len(hold) and self._leader_reachable() else []
        queue = self._SyncObj__commandsQueue
        first = _ReleasedFirst(released, queue)
        transport = self._SyncObj__transport
        send = transport.send

        def send_or_hold(node: Any, message: Any) -> bool:
            if (
                isinstance(message, dict)
                and message.get("type") == "apply_command"
                and (len(hold) or not self._may_forward(node))  # in order, behind held ones
            ):
                self._hold(hold, message, now)
                return False
            return bool(send(node, message))

        transport.send = send_or_hold  # this call only: the class's method after it
        if released:
            self._SyncObj__commandsQueue = first
        try:
            super()._checkCommandsToApply()
        finally:
            del transport.send
            if released:
                self._SyncObj__commandsQueue = queue
                hold.put_back(list(first.released))

    def _leader_reachable(self) -> bool:
        leader = self._SyncObj__raftLeader
        if leader is None:
            return False
        if self._SyncObj__raftState == _RAFT_STATE.LEADER:
            return True
        return self._may_forward(leader)

    def _may_forward(self, node: Any) -> bool:
        """The link to ``node`` is up and past pysyncobj's handshake (the key exchange and
        the address: what pysyncobj waits for before it sends its own AppendEntries).
        A TCP link is "connected" before that; a command written then is lost without a
        word -- test_raft_forward_nodes.py lost it every time the follower was the seed
        that dials, when this asked the transport alone."""
        return node in self._SyncObj__connectedNodes and link_up(self._SyncObj__transport, node)

    def _hold(self, hold: ForwardHold, message: dict[str, Any], now: float) -> None:
        """The forward was never written: out of pysyncobj's bookkeeping, into the hold."""
        waiting = self._SyncObj__commandsWaitingReply
        callback = waiting.pop(message["request_id"], None) if "request_id" in message else None
        if not hold.hold(message["command"], callback, now) and callback is not None:
            callback(None, NOT_SENT)
