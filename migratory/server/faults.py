"""A test-only fault switch: make the server drop, duplicate or reorder ONE delivery.

It exists so that the chaos checker can be shown to catch each kind of violation.
It is off unless the environment variable ``MIGRATORY_TEST_FAULT`` is set when the
server starts (``drop:N``, ``duplicate:N`` or ``reorder:N``: the fault hits the
first subscriber of the N-th message fanned out). No config key and no client
operation can turn it on, and the server logs a warning at start when it is on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

ENV = "MIGRATORY_TEST_FAULT"
KINDS = ("drop", "duplicate", "reorder")


class Sink(Protocol):
    def deliver(self, frame: bytes) -> None: ...


@dataclass(slots=True)
class DeliveryFault:
    kind: str
    after: int
    _count: int = 0
    _held: tuple[Sink, bytes] | None = None
    done: bool = False
    _victim: Sink | None = field(default=None)
    report: Callable[[str], None] = print  # the server passes a logger (this module is I/O-free)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> DeliveryFault | None:
        text = environ.get(ENV)
        if not text:
            return None
        kind, _, after = text.partition(":")
        if kind not in KINDS or not after.isdigit() or int(after) < 1:
            raise ValueError(
                f"{ENV} must be one of {', '.join(KINDS)} followed by :N, got {text!r}"
            )
        return cls(kind, int(after))

    def describe(self) -> str:
        return f"TEST FAULT SWITCH ON: {self.kind} the delivery of message {self.after}"

    def fan_out(self, frame: bytes, sinks: Iterable[Sink]) -> None:
        """Deliver ``frame`` to ``sinks``, applying the fault once."""
        sinks = tuple(sinks)
        self._count += 1
        if self._held is not None and self._victim in sinks:
            held_sink, held_frame = self._held
            self._held = None
            for sink in sinks:
                sink.deliver(frame)
                if sink is held_sink:
                    sink.deliver(held_frame)  # the earlier message arrives after this one
            return
        if self.done or self._count != self.after or not sinks:
            for sink in sinks:
                sink.deliver(frame)
            return
        self.done = True
        victim = self._victim = sinks[0]
        self.report(f"TEST FAULT: {self.kind} of message {self._count} for one subscriber")
        for sink in sinks:
            if sink is not victim:
                sink.deliver(frame)
            elif self.kind == "duplicate":
                sink.deliver(frame)
                sink.deliver(frame)
            elif self.kind == "reorder":
                self._held = (sink, frame)
            # drop: nothing
