"""The raw auditor's resume positions (chaos/raw_workload.py), on scripted sessions: no
member process, virtual time."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import chaos.raw_workload as raw
from chaos.history import History
from chaos.plan import SubscriberPlan, plan_workload
from chaos.workload import Workload
from migratory.model.position import Position
from migratory.protocol import ops

S0 = "/chaos/s0"


class Scripted:
    """A RawSession that hands over ``script``'s operations, then drops."""

    def __init__(self, script: list[ops.ServerOp]) -> None:
        self.script = script
        self.asked: list[list[tuple[str, tuple[int, int] | None]]] = []

    async def __aenter__(self) -> Scripted:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None

    async def subscribe(self, subjects: list[tuple[str, tuple[int, int] | None]], *,
                        history: int = 0) -> None:
        self.asked.append(subjects)

    async def ops(self, *, ping_every: float, pong_timeout: float) -> AsyncIterator[ops.ServerOp]:
        for op in self.script:
            yield op
        raise ConnectionError("dropped")


def _resume_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                  first: list[ops.ServerOp]) -> tuple[int, int] | None:
    """What the auditor asks for S0 on its second connection after ``first``."""
    sessions = [Scripted(first), Scripted([])]
    opened: list[Scripted] = []

    async def open_session(port: int, name: str) -> Scripted:
        if not sessions:
            await trio.sleep_forever()
        opened.append(sessions.pop(0))
        return opened[-1]

    monkeypatch.setattr(raw.RawSession, "open", open_session)
    plan = plan_workload(3, members=3, subjects=2, sdk_subscribers=1, auditors=1)
    w = Workload(seed=3, plan=plan, client_urls=["ws://127.0.0.1:1"] * 3,
                 history=History(tmp_path, "r", time.monotonic()), say=lambda text: None)
    spec = SubscriberPlan("a0", "raw", 0, (S0,), 0, 0.0)

    async def main() -> None:
        with trio.move_on_after(10):
            await raw.raw_auditor(w, spec, trio.Event())

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    w.h.close()
    assert len(opened) == 2
    ((subject, position),) = opened[1].asked[0]
    assert subject == S0
    return position


def test_an_auditor_resumes_from_the_position_its_fresh_subscribe_was_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Subscribed at (1, 0) (the subject not numbered yet), dropped before any message:
    it resumes from (1, 0), as the SDK and an EventSource do, and not afresh. Afresh, a
    member that forgot the subject (its first messages expired) answers a position that
    does not cover them, and the checker counts them lost (chaos seed 43,
    CacheExpireTime=1: 4 raw lost)."""
    allow = ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, S0, Position(1, 0))
    assert _resume_asked(tmp_path, monkeypatch, [allow]) == (1, 0)


def test_an_auditor_resumes_from_the_last_message_and_from_a_resync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from migratory.model.message import Message, MessageType

    allow = ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, S0, Position(7, 3))
    message = Message(S0, b"p0-4|chaos", {}, False, epoch=7, seq=4, type=MessageType.UPDATE)
    assert _resume_asked(tmp_path, monkeypatch, [allow, ops.Deliver((message,))]) == (7, 4)
    resync = ops.SubjectStatus(ops.Status.DATA_RESYNC, S0, Position(9, 2))
    assert _resume_asked(tmp_path / "b", monkeypatch, [allow, resync]) == (9, 2)
