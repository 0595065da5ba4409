"""Containers of cached messages that the garbage collector does not walk.

A full collection visits every item of every tracked container, tracked or not: a
seed's two caches (its hub's and the replicated one) held ~1.1 million entry tuples in
per-subject deques under the default ``CacheMemoryBudget``, and walking them was ~100 ms
of each full collection's ~155 ms on this machine (docs/benchmarks.md, issue 13), the
seeds' event loops stopping 330-550 ms at a time under load. The entries are tuples of
immutable atoms (CPython untracks them itself), so a deque that holds only them can be
part of no reference cycle, and the collector has nothing to find in it: :func:`untrack`
takes it out of the collector's lists (``PyObject_GC_UnTrack``, what CPython does for
such tuples and dicts). Reference counting frees it as before.

Only for a container whose items can never refer back to it or to anything tracked that
could: an untracked object's references keep what they reach alive against the
collector, so a cycle through one is never freed.
"""

from __future__ import annotations

import ctypes
import gc
from typing import TypeVar

__all__ = ["untrack"]

T = TypeVar("T")

_untrack = ctypes.pythonapi.PyObject_GC_UnTrack
_untrack.argtypes = [ctypes.py_object]
_untrack.restype = None


def untrack(container: T) -> T:
    """``container``, no longer tracked by the garbage collector."""
    if gc.is_tracked(container):
        _untrack(container)
    return container
