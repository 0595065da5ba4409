"""What a Raft dump carries of the node itself: pysyncobj's code version, nothing of ours.

pysyncobj pickles into every dump each attribute of the ``SyncObj`` that was not there when
its ``__init__`` ended (meant for a subclass that replicates its own attributes through
``@replicated`` methods), and a node that loads a dump -- its own at a restart, or one the
leader sent -- sets every one of them on itself. Ours replicates through its consumer
(:mod:`cluster.raft_consumer`), and its parts keep this process's own state in attributes
set after ``__init__``: the election back-off's ``_stood_at`` and ``_doublings``
(:mod:`cluster.raft_election_timer`), pre-vote's ``_heard_leader_at`` and campaign
(:mod:`cluster.raft_prevote_node`), ``_linked_once``, ``_waiting_since``. A dump carried them
to every seed that loaded it, read on another process's monotonic clock: a seed that
loaded a dump written on a machine up longer than its own (a pod rescheduled on a newer
node, a machine rebooted; a fresh CI box loading the recorded 524f73f cluster's dumps)
found its last candidacy hours in the future, doubled its election timeout thousands of
times and raised ``OverflowError`` at every tick: its Raft thread never ran again
(``tests/cluster/test_raft_own_state.py``). Likewise a leader heard "in the future" would
have kept it refusing every pre-vote until its clock got there.

So dumps are written without them (:class:`NotInDumps` as pysyncobj's list of the
attributes it leaves out) and read without them (:func:`own_state_only`, for dumps an
older version wrote).
"""

from __future__ import annotations

from typing import Any

__all__ = ["REPLICATED_OWN", "NotInDumps", "own_state_only"]

REPLICATED_OWN = frozenset({"_SyncObj__enabledCodeVersion"})
"""The node's own attributes a dump carries: pysyncobj's, set by a replicated command."""


class NotInDumps:
    """pysyncobj's ``__properies`` (the names a dump leaves out): all but
    :data:`REPLICATED_OWN`."""

    def __contains__(self, name: object) -> bool:
        return name not in REPLICATED_OWN


def own_state_only(data: Any) -> Any:
    """A dump as read (``(state, last entry, entry before it, cluster)``), the node's own
    part of ``state`` cut to :data:`REPLICATED_OWN`; the consumers' parts as they are."""
    state = data[0]
    if isinstance(state, list) and state and isinstance(state[0], dict):
        state = [_kept(state[0]), *state[1:]]
    elif isinstance(state, dict):
        state = _kept(state)
    else:
        return data
    return type(data)((state, *data[1:])) if isinstance(data, (tuple, list)) else data


def _kept(own: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in own.items() if name in REPLICATED_OWN}
