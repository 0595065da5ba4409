"""The numbering a Coordinator dumps and loads, apart from the Coordinator: the digest's
term of every subject's seq, and the checks of a dump's numbering (run in the decoding
thread, cluster/dump_decoder.py, and by ``Coordinator.from_state``). Pure."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any, TypeGuard

from migratory.model.position import EPOCH_LIMIT


def seqs_sum(seqs: Mapping[str, int]) -> int:
    """The digest's term for ``seqs``: the sum over subjects of ``hash((code, seq)) -
    hash((code, 0))``, ``code`` the CRC-32 of the subject (a tuple of ints hashes alike in
    every process, unlike a string), so that numbering one more message of a subject
    changes it by two hashes."""
    total = 0
    for subject, seq in seqs.items():
        code = zlib.crc32(subject.encode("utf-8"))
        total += hash((code, seq)) - hash((code, 0))
    return total


_State = tuple[dict[int, int], dict[str, int], dict[str, int], dict[str, dict[int, int]]]
_Numbering = tuple[_State, tuple[dict[str, int], dict[int, int]]]


def _numbering(state: Any, handed: Any) -> _Numbering:
    """In the decoding thread: a dump's numbering, and the copies its positions read."""
    if not (isinstance(state, tuple) and len(state) == 4
            and all(isinstance(part, dict) for part in state)):
        raise TypeError(f"the numbering is a {type(state).__name__}, not 4 dicts")
    group_epochs, seqs, _, _ = state
    return state, (dict(seqs), dict(group_epochs))


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_epoch(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value < EPOCH_LIMIT
