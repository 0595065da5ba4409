"""A test-only fault switch: make the server drop, duplicate or reorder ONE delivery.

It exists so that the chaos checker can be shown to catch each kind of violation.
It is off unless the environment variable ``MIGRATORY_TEST_FAULT`` is set when the
server starts: ``KIND:N`` or ``KIND:N:PREFIX`` with KIND ``drop``, ``duplicate`` or
``reorder``. The fault hits one subscriber of the N-th message fanned out: the first
one, or with PREFIX the first whose client name starts with PREFIX (then only messages
fanned out to such a subscriber count). ``reorder`` holds that delivery back until
the victim's next message of the same subject. Several faults, comma-separated, each
with its own PREFIX (``drop:20:a0,duplicate:20:a1``), act at once, each on the
subscribers its prefix names (the first matching prefix takes a subscriber): one chaos
run then plants every kind. No config key and no client operation can turn it on, and
the server logs a warning at start when it is on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

ENV = "MIGRATORY_TEST_FAULT"
KINDS = ("drop", "duplicate", "reorder")


class Sink(Protocol):
    def deliver(self, frame: bytes) -> None: ...


def client_name(sink: Sink) -> str:
    """The name the client gave in ``connect`` (sessions have one; other sinks: "")."""
    identity = getattr(sink, "identity", None)
    return str(getattr(identity, "name", "") or "")


@dataclass(slots=True)
class DeliveryFault:
    kind: str
    after: int
    prefix: str = ""
    _count: int = 0
    _held: tuple[Sink, bytes, object] | None = None
    done: bool = False
    report: Callable[[str], None] = print  # the server passes a logger (this module is I/O-free)

    @classmethod
    def parse(cls, text: str) -> DeliveryFault:
        """One fault from ``KIND:N[:PREFIX]``; ValueError naming the variable otherwise."""
        kind, _, rest = text.partition(":")
        after, _, prefix = rest.partition(":")
        if kind not in KINDS or not after.isdigit() or int(after) < 1:
            raise ValueError(
                f"{ENV} must be one of {', '.join(KINDS)} followed by :N and an optional "
                f":CLIENT_PREFIX, got {text!r}"
            )
        return cls(kind, int(after), prefix)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> DeliveryFault | DeliveryFaults | None:
        """The switch ``MIGRATORY_TEST_FAULT`` asks for: None (off), one fault, or several."""
        text = environ.get(ENV)
        if not text:
            return None
        specs = text.split(",")
        if len(specs) == 1:
            return cls.parse(text)
        faults = [cls.parse(spec) for spec in specs]
        prefixes = [f.prefix for f in faults]
        if "" in prefixes or len(set(prefixes)) != len(prefixes):
            raise ValueError(
                f"{ENV}: several faults need one distinct :CLIENT_PREFIX each, got {text!r}"
            )
        return DeliveryFaults(faults)

    def describe(self) -> str:
        whom = f" to a client named {self.prefix}*" if self.prefix else ""
        return f"TEST FAULT SWITCH ON: {self.kind} the delivery of message {self.after}{whom}"

    def fan_out(self, frame: bytes, sinks: Iterable[Sink], subject: object = None) -> None:
        """Deliver ``frame`` (a message of ``subject``) to ``sinks``, applying the fault once."""
        sinks = tuple(sinks)
        if self._held is not None:
            held_sink, held_frame, held_subject = self._held
            if held_subject == subject and held_sink in sinks:
                self._held = None
                for sink in sinks:
                    sink.deliver(frame)
                    if sink is held_sink:
                        sink.deliver(held_frame)  # the earlier message arrives after this one
                return
        victim = None if self.done else self._count_towards_fault(sinks)
        for sink in sinks:
            if sink is not victim:
                sink.deliver(frame)
            elif self.kind == "duplicate":
                sink.deliver(frame)
                sink.deliver(frame)
            elif self.kind == "reorder":
                self._held = (sink, frame, subject)
            # drop: nothing

    def _count_towards_fault(self, sinks: tuple[Sink, ...]) -> Sink | None:
        """Count this message if it goes to a possible victim; the victim when it is due."""
        victim = next((s for s in sinks if client_name(s).startswith(self.prefix)), None)
        if victim is None:
            return None
        self._count += 1
        if self._count != self.after:
            return None
        self.done = True
        self.report(
            f"TEST FAULT: {self.kind} of message {self._count} for client "
            f"{client_name(victim) or '?'}"
        )
        return victim


@dataclass(slots=True)
class DeliveryFaults:
    """Several faults at once, each on the subscribers its prefix names."""

    faults: list[DeliveryFault]

    @property
    def report(self) -> Callable[[str], None]:
        return self.faults[0].report

    @report.setter
    def report(self, report: Callable[[str], None]) -> None:
        for fault in self.faults:
            fault.report = report

    def describe(self) -> str:
        return "; ".join(fault.describe() for fault in self.faults)

    def fan_out(self, frame: bytes, sinks: Iterable[Sink], subject: object = None) -> None:
        rest = list(sinks)
        for fault in self.faults:
            mine = [s for s in rest if client_name(s).startswith(fault.prefix)]
            if mine:
                fault.fan_out(frame, mine, subject)
                rest = [s for s in rest if not client_name(s).startswith(fault.prefix)]
        for sink in rest:
            sink.deliver(frame)
