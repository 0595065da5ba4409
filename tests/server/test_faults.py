"""The test-only fault switch does exactly one thing, once, and only when asked."""

from __future__ import annotations

from typing import Any

import pytest
from rawclient import RawClient

from migratory.model.message import Message
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


def test_server_started_with_the_switch_says_so_and_applies_it(
    start_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MIGRATORY_TEST_FAULT", "duplicate:2")
    server = start_server(BatchTime="0")
    subscriber = RawClient(server.port)
    subscriber.connect()
    subscriber.subscribe("/a/b")
    subscriber.recv_op()
    publisher = RawClient(server.port)
    publisher.connect()
    for i in range(3):
        publisher.publish(Message("/a/b", str(i).encode(), closure=str(i)))
    got = [m.seq for m in subscriber.recv_messages(4)]
    assert got == [1, 2, 2, 3]
    assert "TEST FAULT SWITCH ON" in server.log()
    assert "TEST FAULT: duplicate of message 2" in server.log()
