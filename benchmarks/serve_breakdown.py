#!/usr/bin/env python3
"""``python -m cluster ARGS`` with a CPU breakdown of the server's loop, for benchmarks.

SIGUSR1 starts counting, SIGUSR2 stops and writes JSON to ``$BREAKDOWN_OUT``: the trio
thread's CPU time (``time.thread_time``) inside the loop's I/O waits (``epoll_wait``), in
``Session.receive_data`` (decoding and processing a client's input: for a publisher, the
publish path and its fan-out into outboxes), in ``Connection._write`` (one ``send`` each,
the kernel's loopback work included) and in the rest of ``Connection._after_processing``,
the garbage collections, and the total; what is left is trio's scheduling, ``recv``,
``epoll_ctl`` and the other tasks (ticks, probes). Counting costs ~1 us per wrapped call:
compare the parts, not the totals (``benchmarks/subjects_cpu.py --breakdown``).
"""

from __future__ import annotations

import functools
import gc
import json
import os
import runpy
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

from migratory.server import connection, session

_clock = time.thread_time
_state: dict[str, Any] = {"on": False}


def _reset(*_args: object) -> None:
    _state.clear()
    _state.update(on=True, started=_clock(), mark=_clock(), passes=0, io_wait=0.0)


def _report(*_args: object) -> None:
    _state["on"] = False
    figures = {
        k: v for k, v in _state.items() if k not in ("on", "mark", "started", "gc_at", "inside")
    }
    figures["total"] = _clock() - _state.get("started", _clock())
    with open(os.environ.get("BREAKDOWN_OUT", "breakdown.json"), "w") as f:
        json.dump(figures, f)


class _LoopWaits(trio.abc.Instrument):
    def before_io_wait(self, timeout: float) -> None:
        _state["mark"] = _clock()

    def after_io_wait(self, timeout: float) -> None:
        if _state["on"]:
            _state["io_wait"] += _clock() - _state["mark"]
            _state["passes"] += 1


def _timed(cls: type, name: str, key: str) -> None:
    inner = getattr(cls, name)

    @functools.wraps(inner)
    def timed(self: object, *args: object, **kwargs: object) -> object:
        if not _state["on"]:
            return inner(self, *args, **kwargs)
        started = _clock()
        outer = _state.get("inside")
        _state["inside"] = key
        try:
            return inner(self, *args, **kwargs)
        finally:
            _state["inside"] = outer
            spent = _clock() - started
            _state[key] = _state.get(key, 0.0) + spent
            _state[key + "_calls"] = _state.get(key + "_calls", 0) + 1
            if outer is not None:  # also counted in the outer call's figure
                _state[f"{key}_in_{outer}"] = _state.get(f"{key}_in_{outer}", 0.0) + spent

    setattr(cls, name, timed)


def _collections(phase: str, info: dict[str, int]) -> None:
    if not _state["on"]:
        return
    if phase == "start":
        _state["gc_at"] = _clock()
    elif "gc_at" in _state:
        _state["gc"] = _state.get("gc", 0.0) + _clock() - _state.pop("gc_at")
        _state["gc_calls"] = _state.get("gc_calls", 0) + 1


def main() -> None:
    _timed(session.Session, "receive_data", "receive_data")
    _timed(connection.Connection, "_after_processing", "after_processing")
    _timed(connection.Connection, "_write", "write")
    gc.callbacks.append(_collections)
    signal.signal(signal.SIGUSR1, _reset)
    signal.signal(signal.SIGUSR2, _report)
    run = trio.run

    def instrumented(*args: Any, **kwargs: Any) -> Any:
        kwargs["instruments"] = [*kwargs.get("instruments", ()), _LoopWaits()]
        return run(*args, **kwargs)

    trio.run = instrumented  # type: ignore[assignment]
    sys.argv = ["cluster", *sys.argv[1:]]
    runpy.run_module("cluster", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
