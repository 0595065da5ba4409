"""A large Raft entry arrives in parts: the follower takes it once every part is in.

pysyncobj's leader cuts an entry of ``appendEntriesBatchSizeBytes`` or more into parts
(``transmission``: ``start``, ``process`` ..., ``finish``) sent as AppendEntries messages;
:class:`LargeEntryParts` gives :class:`cluster.raft_follower.FollowerSafeSyncObj` the
entries of such a message once they are whole (``tests/cluster/test_raft_large_entry.py``).
"""

from __future__ import annotations

import pickle
from typing import Any

from pysyncobj import SyncObj

from cluster import raft_unpickler

__all__ = ["LargeEntryParts"]


class LargeEntryParts(SyncObj):  # type: ignore[misc]
    """``SyncObj`` whose follower gathers the parts of a large entry."""

    _SyncObj__recvTransmission: Any

    def _received_entries(self, node: Any, message: dict[str, Any]) -> list[Any] | None:
        """The message's entries; None while a large entry is still arriving in parts.

        pysyncobj's leader cuts an entry of ``appendEntriesBatchSizeBytes`` or more into
        parts ``start``, ``process`` ..., ``finish``, but it marks a part ``finish`` as soon
        as the part reaches the length of the entry's *command*, not of the pickled entry,
        which is longer (protocol 2 pickles each byte >= 0x80 as two): a big binary
        command comes as ``start``, ``finish``, ``finish``. A ``finish`` whose data does not
        unpickle yet is therefore one more part; the entry is taken once it unpickles (a
        strict prefix of a pickle never does: the STOP opcode is its last byte).
        """
        transmission = message.get("transmission")
        if transmission is None:
            return list(message.get("entries", []))
        if transmission == "start":
            received = bytes(message["data"])
        elif transmission in ("process", "finish"):
            received = self._received_part() + message["data"]
        else:
            raise ValueError(f"unknown append_entries transmission {transmission!r}")
        if transmission == "finish":
            try:
                entry = raft_unpickler.loads(received)
            except (pickle.UnpicklingError, EOFError):
                pass  # an early "finish": more parts follow
            else:
                self._SyncObj__recvTransmission = b""
                return [entry]
        self._SyncObj__recvTransmission = received
        self._SyncObj__sendNextNodeIdx(node, success=False, reset=False)
        return None

    def _received_part(self) -> bytes:
        """What has arrived of a large entry (pysyncobj starts with ``""``)."""
        received = self._SyncObj__recvTransmission
        return received if isinstance(received, bytes) else b""
