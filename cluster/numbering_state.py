"""The numbering a Coordinator dumps and loads, apart from the Coordinator: the digest's
term of every subject's seq, and the checks of a dump's numbering (run in the decoding
thread, cluster/dump_decoder.py, and by ``Coordinator.from_state``), subject groups, and the
positions read over a copy of the numbering. Pure."""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeGuard

from migratory.model.position import EPOCH_LIMIT

if TYPE_CHECKING:  # (a thread runs there: see cluster/coordination.py)
    from cluster.dump_decoder import DumpDecoding


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


GROUP_COUNT: Final = 64
"""Subjects hash into this many subject groups; each group has one epoch."""


def subject_group(subject: str) -> int:
    """The subject group of ``subject``: CRC-32 of its UTF-8 bytes modulo GROUP_COUNT."""
    return zlib.crc32(subject.encode("utf-8")) % GROUP_COUNT


class NumberedPositions(Mapping[str, tuple[int, int]]):
    """Subject -> ``(epoch, seq)`` over a copy of the numbering
    (:meth:`Coordinator.positions_now`)."""

    __slots__ = ("_epochs", "_later", "_seqs")

    def __init__(self, seqs: dict[str, int], group_epochs: dict[int, int],
                 later: DumpDecoding[_Numbering] | None = None) -> None:
        self._seqs = seqs
        self._epochs = group_epochs
        self._later = later
        """A dump's numbering decoding: its copies, once decoded (a read waits)."""

    def ready(self) -> bool:
        """Whether a read answers at once (else it waits for the dump's numbering)."""
        return self._later is None or self._later.done()

    def _copies(self) -> tuple[dict[str, int], dict[int, int]]:
        if self._later is not None:
            _, (self._seqs, self._epochs) = self._later.result()
            self._later = None
        return self._seqs, self._epochs

    def __getitem__(self, subject: str) -> tuple[int, int]:
        seqs, epochs = self._copies()
        return epochs[subject_group(subject)], seqs[subject]

    def __iter__(self) -> Iterator[str]:
        return iter(self._copies()[0])

    def __len__(self) -> int:
        return len(self._copies()[0])
