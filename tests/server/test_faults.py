"""The test-only fault switch does exactly one thing, once, and only when asked."""

from __future__ import annotations

import pytest

from migratory.server.faults import DeliveryFault


class Sink:
    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def deliver(self, frame: bytes) -> None:
        self.frames.append(frame)


def run(kind: str) -> tuple[list[bytes], list[bytes]]:
    fault = DeliveryFault.from_environment({"MIGRATORY_TEST_FAULT": f"{kind}:2"})
    assert fault is not None
    victim, other = Sink(), Sink()
    for frame in (b"1", b"2", b"3", b"4"):
        fault.fan_out(frame, [victim, other])
    return victim.frames, other.frames


def test_off_unless_the_environment_says_so() -> None:
    assert DeliveryFault.from_environment({}) is None


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("drop", [b"1", b"3", b"4"]),
        ("duplicate", [b"1", b"2", b"2", b"3", b"4"]),
        ("reorder", [b"1", b"3", b"2", b"4"]),
    ],
)
def test_one_fault_for_one_subscriber(kind: str, expected: list[bytes]) -> None:
    victim, other = run(kind)
    assert victim == expected
    assert other == [b"1", b"2", b"3", b"4"]


@pytest.mark.parametrize("text", ["explode:1", "drop", "drop:0", "drop:x"])
def test_bad_switch_values_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="MIGRATORY_TEST_FAULT"):
        DeliveryFault.from_environment({"MIGRATORY_TEST_FAULT": text})
