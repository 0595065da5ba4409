"""The trio SDK's reconnect loop at its limits, in virtual time (MockClock, members on
memory streams: tests/client/sdk_memory_members.py): members that refuse every fresh
token for ten minutes, that are down, silent, or drop the connection after the
upgrade; the application closing the client in the middle of a back-off or of an
attempt; a resume after many failed attempts. Each test takes well under a second of
wall time (benchmarks/sdk_refused_reconnect.py measures the same on real sockets)."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import trio
import trio.testing
from sdk_fake_server import FakeConnection, update
from sdk_memory_members import (
    DOWN,
    SILENT,
    UPGRADE_CLOSE,
    MemoryMembers,
    Serve,
    memory_members,
    refuse_token,
    task_count,
)

from migratory.model.message import MessageType
from migratory.model.position import Position
from migratory.protocol import close_codes, ops
from migratory_client import (
    Client,
    ConnectionClosedError,
    Notification,
    NotificationStatus,
    ReconnectPolicy,
    connect,
)

A, B, C = "ws://a:1", "ws://b:1", "ws://c:1"
POLICY = ReconnectPolicy()  # the default: 0.5 s doubling to 30 s, jitter 0.5
MINUTES = 10


def run_virtual(test: Callable[[], Awaitable[None]]) -> float:
    """Run ``test`` under a MockClock; returns the process's CPU seconds it took."""
    started = time.process_time()
    trio.run(test, clock=trio.testing.MockClock(autojump_threshold=0))
    return time.process_time() - started


def check_backoff(cluster: MemoryMembers, policy: ReconnectPolicy, until: float) -> None:
    """Attempts bounded, growing, jittered: per minute, and between attempts."""
    per_minute = cluster.per_minute(until)
    ceiling = 60 / (policy.max_delay * (1 - policy.jitter)) + 1
    assert all(2 <= n <= ceiling for n in per_minute[1:]), per_minute
    assert sum(per_minute) <= 40, per_minute  # never a hot loop: ~30 in 10 minutes
    gaps = [b.at - a.at for a, b in zip(cluster.attempts, cluster.attempts[1:], strict=False)]
    assert all(policy.max_delay * (1 - policy.jitter) <= g <= policy.max_delay for g in gaps[8:])
    assert len({round(g, 6) for g in gaps}) == len(gaps)  # jittered: no two alike
    assert gaps[0] <= policy.initial_delay and max(gaps[:5]) < policy.max_delay / 2  # growing


async def refused_for_ten_minutes(
    monkeypatch: pytest.MonkeyPatch,
    members: dict[str, Serve | str],
    token_calls: list[int],
    policy: ReconnectPolicy = POLICY,
) -> tuple[MemoryMembers, list[str], list[int]]:
    """The client against ``members`` for MINUTES of virtual time: the members' record,
    the reason of every SERVER_DOWN, and the tasks alive at each."""
    def provider() -> str:
        token_calls.append(1)
        return f"fresh-{len(token_calls)}"

    reasons: list[str] = []
    tasks: list[int] = []
    async with trio.open_nursery() as nursery:
        with memory_members(monkeypatch, nursery, members) as cluster:
            async with connect(
                list(members), token_provider=provider, reconnect=policy, rng=random.Random(1)
            ) as client:
                with trio.move_on_after(MINUTES * 60):
                    async for note in client.notifications():
                        assert note.status is NotificationStatus.SERVER_DOWN, note
                        reasons.append(note.reason or "")
                        tasks.append(task_count())
                assert client.error is None  # none of these is terminal: it keeps trying
            nursery.cancel_scope.cancel()
    return cluster, reasons, tasks


def test_every_fresh_token_refused_for_ten_minutes_backs_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every member closes every ``connect`` 4503 TOKEN_EXPIRED, whatever fresh token
    the provider gives: each attempt asks the provider once, sends its token, is told to
    the application (SERVER_DOWN with the close), and the next waits the back-off."""
    calls: list[int] = []
    outcome: list[tuple[MemoryMembers, list[str], list[int]]] = []

    async def main() -> None:
        members: dict[str, Serve | str] = {A: refuse_token, B: refuse_token, C: refuse_token}
        outcome.append(await refused_for_ten_minutes(monkeypatch, members, calls))

    cpu = run_virtual(main)
    cluster, reasons, tasks = outcome[0]
    assert max(tasks) <= min(tasks) + 2, tasks  # nothing piles up attempt after attempt
    check_backoff(cluster, POLICY, MINUTES * 60)
    assert len(calls) == len(cluster.attempts) == len(reasons)
    tokens = [a.connect.token for a in cluster.attempts if a.connect is not None]
    assert tokens == [f"fresh-{i + 1}" for i in range(len(calls))]  # a fresh one each time
    assert all("4503 TOKEN_EXPIRED" in r for r in reasons), reasons[:3]
    assert cpu < 5  # ten minutes of refusals: a few ms of CPU each


@pytest.mark.parametrize(
    "kinds",
    [(DOWN,) * 3, (SILENT,) * 3, (UPGRADE_CLOSE,) * 3, (DOWN, SILENT, UPGRADE_CLOSE)],
    ids=["down", "silent", "upgrade-close", "mixed"],
)
def test_members_that_never_give_a_session_are_backed_off_from(
    monkeypatch: pytest.MonkeyPatch, kinds: tuple[str, str, str]
) -> None:
    """TCP refused, TCP taken and never a word (each attempt gives up after
    ``connect_timeout``), the upgrade answered and the connection dropped: the same
    back-off, a SERVER_DOWN with the reason per attempt, no task left behind."""
    calls: list[int] = []
    outcome: list[tuple[MemoryMembers, list[str], list[int]]] = []
    policy = ReconnectPolicy(connect_timeout=2.0)

    async def main() -> None:
        members: dict[str, Serve | str] = dict(zip((A, B, C), kinds, strict=True))
        outcome.append(await refused_for_ten_minutes(monkeypatch, members, calls, policy))

    run_virtual(main)
    cluster, reasons, tasks = outcome[0]
    assert max(tasks) <= min(tasks) + 2, tasks  # nothing piles up attempt after attempt
    if SILENT not in kinds:
        check_backoff(cluster, policy, MINUTES * 60)
    per_minute = cluster.per_minute(MINUTES * 60)
    longest = policy.max_delay + (policy.connect_timeout if SILENT in kinds else 0)
    assert min(per_minute[1:]) >= 60 // longest and max(per_minute[1:]) <= 5, per_minute
    assert len(calls) == len(cluster.attempts)
    assert len(reasons) in (len(calls), len(calls) - 1)  # (one still under way at the end)
    expected = {DOWN: "Connection refused", SILENT: "within 2.0 s",
                UPGRADE_CLOSE: "connection lost"}
    for attempt, reason in zip(cluster.attempts, reasons, strict=False):
        kind = dict(zip((A, B, C), kinds, strict=True))[attempt.url]
        assert expected[kind] in reason, (kind, reason)


async def never_answers() -> str:
    await trio.sleep_forever()
    raise AssertionError("unreachable")


@pytest.mark.parametrize("during", ["back-off", "connect", "token provider"])
def test_closing_mid_attempt_ends_everything_at_once(
    monkeypatch: pytest.MonkeyPatch, during: str
) -> None:
    """The application leaves ``connect()`` while the client waits out a back-off, waits
    for a silent member, or waits for its token provider: the block ends at once (no
    wait for the back-off or connect_timeout), no task is left, no attempt follows."""
    left: list[float] = []
    attempts_after: list[int] = []

    async def main() -> None:
        member = SILENT if during == "connect" else DOWN
        provider = never_answers if during == "token provider" else None
        policy = ReconnectPolicy(initial_delay=20, max_delay=20, connect_timeout=20)
        async with trio.open_nursery() as nursery:
            with memory_members(monkeypatch, nursery, {A: member}) as cluster:
                tasks_before = task_count()
                async with connect([A], reconnect=policy, token_provider=provider) as client:
                    if during == "back-off":
                        async for _ in client.notifications():
                            break  # the first SERVER_DOWN: now in the 10-20 s back-off
                    else:
                        await trio.sleep(1)
                    closing = trio.current_time()
                left.append(trio.current_time() - closing)
                made = len(cluster.attempts)
                await trio.sleep(600)
                attempts_after.append(len(cluster.attempts) - made)
                assert task_count() <= tasks_before  # every task of the client ended
            nursery.cancel_scope.cancel()

    run_virtual(main)
    assert left == [0.0]  # not after the back-off or connect_timeout
    assert attempts_after == [0]


def test_a_resume_after_30_refused_attempts_keeps_the_position(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Delivered up to seq 11, the session lost; 30 attempts refused (4503 from A, TCP
    refused by B); then A serves: the resubscribe carries (7, 11), the recovered 11 is
    dropped as a duplicate, 12-14 come once, in order."""
    refusals = 30
    seen: list[ops.Subscribe] = []
    connections = 0

    async def a_member(conn: FakeConnection) -> None:
        nonlocal connections
        connections += 1
        if connections == 1:
            await conn.accept_session()
            seen.append(await conn.expect(ops.Subscribe))
            await conn.allow("/a/b", 7, 10)
            await conn.deliver(update("/a/b", 11))
            await trio.sleep(1)
            await conn.drop()
        elif len(cluster.attempts) <= refusals + 1:
            await refuse_token(conn)
        else:
            await conn.accept_session()
            seen.append(await conn.expect(ops.Subscribe))
            await conn.allow("/a/b", 7, 11)
            recovered = [update("/a/b", s, kind=MessageType.RECOVERED) for s in (11, 12, 13)]
            await conn.deliver(*recovered)
            await conn.send(ops.SubjectStatus(ops.Status.DATA_SYNC, "/a/b", Position(7, 13)))
            await conn.deliver(update("/a/b", 14))
            await trio.sleep_forever()

    got: list[tuple[int, str]] = []

    async def main() -> None:
        nonlocal cluster
        policy = ReconnectPolicy(initial_delay=0.1, max_delay=1)
        async with trio.open_nursery() as nursery:
            with memory_members(monkeypatch, nursery, {A: a_member, B: DOWN}) as cluster:
                async with (
                    connect([A, B], reconnect=policy) as client,
                    client.subscribe("/a/b") as subscription,
                ):
                    for _ in range(4):
                        message = await subscription.next_message()
                        got.append((message.seq, message.type.value))
            nursery.cancel_scope.cancel()

    cluster: MemoryMembers
    run_virtual(main)
    assert len(cluster.attempts) >= refusals + 2  # (one more when B's came last)
    assert all(a.url == B or a.connect is not None for a in cluster.attempts)
    assert got == [(11, "update"), (12, "recovered"), (13, "recovered"), (14, "update")]
    resume = seen[-1].subscriptions
    assert [(r.subject, r.position) for r in resume] == [("/a/b", Position(7, 11))]


def test_connect_denied_ends_the_client_at_the_first_whatever_the_provider_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """4003 CONNECT_DENIED is terminal, token provider or not (as documented): one
    attempt, one token asked for, one SERVER_DOWN with the reason, then the client's
    error; no attempt in the ten minutes after."""
    calls: list[int] = []
    notes: list[Notification] = []
    outcome: list[tuple[object, int]] = []

    async def deny(conn: FakeConnection) -> None:
        await conn.expect(ops.Connect)
        await conn.close(4003, "entitlement refused the connection")

    def provider() -> str:
        calls.append(1)
        return f"fresh-{len(calls)}"

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            with memory_members(monkeypatch, nursery, {A: deny, B: deny}) as cluster:
                async with connect([A, B], token_provider=provider) as client:
                    notes.extend([note async for note in _until_ended(client)])
                    await trio.sleep(600)
                    outcome.append((client.error, len(cluster.attempts)))
            nursery.cancel_scope.cancel()

    run_virtual(main)
    [(error, attempts)] = outcome
    assert isinstance(error, ConnectionClosedError) and error.code == 4003
    assert attempts == 1 and calls == [1]
    assert [(n.status, n.reason) for n in notes] == [
        (NotificationStatus.SERVER_DOWN, "closed with 4003 CONNECT_DENIED: "
         "entitlement refused the connection")]


async def _until_ended(client: Client) -> AsyncIterator[Notification]:
    with contextlib.suppress(ConnectionClosedError):
        async for note in client.notifications():
            yield note


def test_a_token_not_valid_yet_backs_off_and_asks_the_provider_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """4504 TOKEN_NOT_YET_VALID (the issuer's clock ahead of a member's) is no 4003: the
    client backs off, asks its provider for a token at each attempt, and has its
    session once the member takes the token (here at the fourth attempt)."""
    calls: list[int] = []
    notes: list[Notification] = []
    outcome: list[tuple[object, list[str | None]]] = []

    async def early_then_accept(conn: FakeConnection) -> None:
        connect = await conn.expect(ops.Connect)
        if connect.token != "fresh-4":
            await conn.close(close_codes.TOKEN_NOT_YET_VALID.code,
                             "the token is not valid before (nbf) 90 s from now")
            return
        await conn.send(ops.Connected("a"))
        await trio.sleep_forever()

    def provider() -> str:
        calls.append(1)
        return f"fresh-{len(calls)}"

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            with memory_members(monkeypatch, nursery, {A: early_then_accept}) as cluster:
                async with connect([A], token_provider=provider, reconnect=POLICY,
                                   rng=random.Random(1)) as client:
                    async for note in client.notifications():
                        notes.append(note)
                        if note.status is not NotificationStatus.SERVER_DOWN:
                            break
                    tokens = [a.connect.token if a.connect else None for a in cluster.attempts]
                    outcome.append((client.error, tokens))
            nursery.cancel_scope.cancel()

    run_virtual(main)
    [(error, tokens)] = outcome
    assert error is None
    assert tokens == ["fresh-1", "fresh-2", "fresh-3", "fresh-4"]
    assert [n.status for n in notes[:3]] == [NotificationStatus.SERVER_DOWN] * 3
    assert all("4504 TOKEN_NOT_YET_VALID" in (n.reason or "") for n in notes[:3])
    assert notes[3].status is not NotificationStatus.SERVER_DOWN
