"""What a piece of code leaves allocated: for tests that bound memory by bytes held."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable


def held_by(fill: Callable[[], object]) -> int:
    """Bytes still allocated (tracemalloc) once ``fill`` returned, what it returns kept
    alive until measured."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = fill()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del kept
    return held
