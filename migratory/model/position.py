"""Positions ``(epoch, seq)`` in the message sequence of a subject."""

import random
from dataclasses import dataclass
from typing import Final

from migratory.model.frozen import positional_constructor

__all__ = ["EPOCH_LIMIT", "Position", "new_epoch", "new_position"]

EPOCH_LIMIT: Final = 2**48
"""Epochs are positive integers below this bound."""

_system_random = random.SystemRandom()


@dataclass(frozen=True, slots=True, order=True)
class Position:
    """Where a message sits in a subject's sequence.

    ``epoch`` names the lineage of the sequence; ``seq`` counts messages within it.
    ``seq == 0`` means "before the first message of the epoch"; the first message has seq 1.
    Positions compare by epoch, then seq; only positions of the same epoch are comparable
    in any meaningful sense.
    """

    epoch: int
    seq: int


def new_epoch(rng: random.Random | None = None) -> int:
    """A random epoch in ``[1, 2**48)``; uses the OS entropy source when ``rng`` is None."""
    return (rng if rng is not None else _system_random).randrange(1, EPOCH_LIMIT)


new_position = positional_constructor(Position)
"""``Position(epoch, seq)`` without its generated frozen ``__init__`` (see
:mod:`migratory.model.frozen`): for the publish path."""
