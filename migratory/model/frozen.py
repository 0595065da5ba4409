"""Fast positional constructors for the frozen, slotted dataclasses of the hot path.

A frozen dataclass's generated ``__init__`` sets each field through
``object.__setattr__(self, name, value)``: for a nine-field :class:`Message` that was
~3.5 µs of a publish's ~17 (benchmarks/publish_path_cpu.py, py-spy under
benchmarks/publish_ceiling.py: frozen ``__init__`` calls were ~15 % of the server's
CPU). :func:`positional_constructor` builds, once per class, a function taking every
field in order that sets the slots through their member descriptors -- about half the
cost -- and builds the same object (tests compare it with the class's own constructor).
The classes stay frozen: only this constructor writes their slots.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["positional_constructor"]

T = TypeVar("T")


def positional_constructor(cls: type[T]) -> Callable[..., T]:
    """``make(field1, field2, ...)`` for a frozen, slotted dataclass without
    ``__post_init__``: every field, in declaration order, positionally."""
    if not dataclasses.is_dataclass(cls) or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has a __post_init__ this constructor would skip")
    names = [f.name for f in dataclasses.fields(cls)]
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    lines = [f"def make({', '.join(names)}):", "    self = _new(_cls)"]
    for i, name in enumerate(names):
        scope[f"_set{i}"] = cls.__dict__[name].__set__
        lines.append(f"    _set{i}(self, {name})")
    lines.append("    return self")
    exec("\n".join(lines), scope)  # only the field names of our own dataclasses
    make: Callable[..., T] = scope["make"]
    make.__qualname__ = f"positional_constructor({cls.__name__})"
    return make
