"""The test-only fault switch does exactly one thing, once, and only when asked."""

from __future__ import annotations

from typing import Any

import pytest
from rawclient import RawClient

from migratory.model.message import Message
from migratory.server.faults import DeliveryFault


class Identity:
    def __init__(self, name: str) -> None:
        self.name = name


class Sink:
    def __init__(self, name: str = "client") -> None:
        self.frames: list[bytes] = []
        self.identity = Identity(name)

    def deliver(self, frame: bytes) -> None:
        self.frames.append(frame)


def run(kind: str) -> tuple[list[bytes], list[bytes]]:
    fault = DeliveryFault.from_environment({"MIGRATORY_TEST_FAULT": f"{kind}:2"})
    assert fault is not None
    victim, other = Sink(), Sink()
    for frame in (b"1", b"2", b"3", b"4"):
        fault.fan_out(frame, [victim, other], "/a/b")
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


def test_a_held_reorder_waits_for_a_message_of_the_same_subject() -> None:
    fault = DeliveryFault.from_environment({"MIGRATORY_TEST_FAULT": "reorder:1"})
    assert fault is not None
    victim = Sink()
    fault.fan_out(b"a1", [victim], "/a")
    fault.fan_out(b"b1", [victim], "/b")  # another subject: the held one stays held
    fault.fan_out(b"a2", [victim], "/a")
    assert victim.frames == [b"b1", b"a2", b"a1"]


def test_a_client_name_prefix_picks_the_victim_and_what_counts() -> None:
    fault = DeliveryFault.from_environment({"MIGRATORY_TEST_FAULT": "drop:2:audit"})
    assert fault is not None
    sdk, auditor = Sink("sdk-1"), Sink("auditor-1")
    fault.fan_out(b"1", [sdk], "/a")  # no auditor subscribed: does not count
    fault.fan_out(b"2", [sdk, auditor], "/a")
    fault.fan_out(b"3", [sdk, auditor], "/a")
    assert sdk.frames == [b"1", b"2", b"3"]
    assert auditor.frames == [b"2"]


def test_several_faults_each_hit_the_subscribers_of_their_prefix() -> None:
    faults = DeliveryFault.from_environment(
        {"MIGRATORY_TEST_FAULT": "drop:2:a0,duplicate:2:a1,reorder:1:a2"}
    )
    assert faults is not None
    sdk, a0, a1, a2 = Sink("s0"), Sink("a0"), Sink("a1"), Sink("a2")
    for frame in (b"1", b"2", b"3"):
        faults.fan_out(frame, [sdk, a0, a1, a2], "/a")
    assert sdk.frames == [b"1", b"2", b"3"]
    assert a0.frames == [b"1", b"3"]
    assert a1.frames == [b"1", b"2", b"2", b"3"]
    assert a2.frames == [b"2", b"1", b"3"]
    assert faults.describe().count("TEST FAULT SWITCH ON") == 3


@pytest.mark.parametrize("text", ["drop:2,duplicate:2", "drop:2:a,duplicate:2:a"])
def test_several_faults_need_distinct_prefixes(text: str) -> None:
    with pytest.raises(ValueError, match="distinct :CLIENT_PREFIX"):
        DeliveryFault.from_environment({"MIGRATORY_TEST_FAULT": text})


@pytest.mark.parametrize(
    "text", ["explode:1", "drop", "drop:0", "drop:x", "drop::a", "drop:1:a,explode:1:b"]
)
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
