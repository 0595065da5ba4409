"""What each node of the simulated Raft world (raft_sim.py) is made of besides pysyncobj:
the one clock, the replicated state machine that records what it applied, the reading of
a journal entry's command, and the capture of the nodes' log lines."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pysyncobj.syncobj as syncobj_module
from pysyncobj import SyncObjConsumer, replicated
from pysyncobj import pickle as pysyncobj_pickle

__all__ = ["Clock", "LogCapture", "Recorder", "command_value"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorder(SyncObjConsumer):  # type: ignore[misc]
    """The replicated state machine: remembers each command with its log index.

    ``applied`` is the replicated state (in every dump); the callbacks, set before
    ``SyncObjConsumer.__init__``, are not."""

    def __init__(
        self,
        on_apply: Callable[[int, bytes], None],
        on_restore: Callable[[list[tuple[int, bytes]]], None],
    ) -> None:
        self._on_apply = on_apply
        self._on_restore = on_restore
        super().__init__()
        self.applied: list[tuple[int, bytes]] = []

    def _deserialize(self, data: dict[str, Any]) -> None:
        """A dump was loaded (the node's own at start-up, or its leader's): the state
        jumped to the dump's, commands applied elsewhere included."""
        super()._deserialize(data)
        self._on_restore(list(self.applied))

    @replicated  # type: ignore[untyped-decorator]
    def put(self, value: bytes) -> int:
        index: int = self._syncObj.raftLastApplied + 1
        self.applied.append((index, value))
        self._on_apply(index, value)
        return index


def command_value(command: bytes) -> bytes | None:
    """The value of a journal entry that calls ``Recorder.put``; None for pysyncobj's own
    (no-op) entries."""
    if command[0] != syncobj_module._COMMAND_TYPE.REGULAR:
        return None
    _, args = pysyncobj_pickle.loads(command[1:])[:2]
    value: bytes = args[0]
    return value


class LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
