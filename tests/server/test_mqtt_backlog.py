"""mqtt_backlog.Backlog alone: a jump's messages, then what came after, in order, a
slice of about ``units`` x MESSAGES_PER_UNIT per drain, stopped when the session is."""

from __future__ import annotations

from migratory.model.message import Message
from migratory.server.mqtt_backlog import HELD_OVERHEAD, Backlog
from migratory.server.session_subscriptions import MESSAGES_PER_UNIT


def test_a_jump_then_what_came_after_in_slices_in_order() -> None:
    made: list[object] = []
    jump = [Message("/a/b", b"%d" % n, seq=n) for n in range(1, 41)]
    backlog = Backlog(jump, 1, lambda message, qos: made.append((message.seq, qos)))
    backlog.hold(lambda: made.append("live"), 10)
    backlog.hold(lambda: made.append("resync"), 0)
    assert len(backlog) == 42 and backlog.held_bytes == 10 + 2 * HELD_OVERHEAD
    assert backlog.drain(2, lambda: False) == 3  # 32 delivered: 1 + 32 // 16 units
    assert made == [(n, 1) for n in range(1, 2 * MESSAGES_PER_UNIT + 1)]
    assert backlog.drain(2, lambda: False) == 1
    assert made[32:] == [(n, 1) for n in range(33, 41)] + ["live", "resync"]
    assert not backlog and backlog.held_bytes == 0


def test_a_drain_stops_with_its_session() -> None:
    made: list[int] = []
    jump = [Message("/a/b", b"x", seq=n) for n in range(1, 11)]
    backlog = Backlog(jump, 1, lambda message, qos: made.append(message.seq))
    backlog.drain(10, lambda: len(made) >= 3)  # the third delivery closed it
    assert made == [1, 2, 3] and len(backlog) == 7 and not backlog.draining
