"""Unexpected member exits: every row of the ``crashes`` table is one.

The chaos runner writes a ``crashes`` row for each member process that exited without
the runner ending it (it ends members only for kill and leave faults and at the final
stop), so every row is a violation: ``members.unexpected_exits`` in the summary.
"""

from __future__ import annotations

from typing import Any

from .load import History

KIND = "members"  # the summary's kind for member-process violations
MAX_EXAMPLES = 20
EXAMPLE_COLUMNS = ("member", "time", "pid", "exit_status", "log_tail")


def unexpected_exits(history: History) -> tuple[int, list[dict[str, Any]]]:
    """(count, the first :data:`MAX_EXAMPLES` crashes in time order with their log tails)."""
    first = history["crashes"].orderBy("time", "_line").limit(MAX_EXAMPLES).collect()
    return history.rows["crashes"], [{c: row[c] for c in EXAMPLE_COLUMNS} for row in first]
