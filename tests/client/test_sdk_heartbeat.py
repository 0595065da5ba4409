"""The SDK's heartbeat (Keepalive.heartbeat, docs/protocol.md "Heartbeats"): it asks for
one in ``connect``; a server that granted one and then sends nothing for twice the
interval is left (SERVER_DOWN "nothing from the server"), with no ping's round trip --
the pings here come once a minute, so a session ended within the tests' hang guard was
ended by the silence. Before: only the ping keepalive (15 + 10 s by default) noticed a
member that went silent without closing (a frozen VM, a SIGSTOP)."""

from __future__ import annotations

import time

import pytest
import trio
from sdk_fake_server import FAST, trio_test, update
from sdk_raw_peer import RawLink, RawPeer
from sdk_raw_sessions import next_note
from trio.testing import MockClock

from migratory.model.position import Position
from migratory.protocol import ops
from migratory_client import Keepalive, NotificationStatus, connect
from migratory_client import session as session_module
from migratory_client.progress import WriteProgress
from migratory_client.session import Session, SessionEnd

SLOW_PINGS = Keepalive(interval=60, timeout=60, heartbeat=0.2)


async def granted(peer: RawPeer, heartbeat_ms: int | None) -> tuple[RawLink, ops.Connect]:
    link = await peer.accept()
    connect_op = await link.expect(ops.Connect)
    assert isinstance(connect_op, ops.Connect)
    link.write(ops.Connected("raw", heartbeat_ms=heartbeat_ms))
    return link, connect_op


@trio_test
async def test_connect_asks_for_the_keepalives_heartbeat_by_default() -> None:
    peer = RawPeer()
    try:
        async with connect([peer.url], reconnect=FAST):
            _, asked = await granted(peer, None)
            assert asked.heartbeat_ms == 2000
        async with connect([peer.url], reconnect=FAST, keepalive=Keepalive(heartbeat=None)):
            _, asked = await granted(peer, None)
            assert asked.heartbeat_ms is None
    finally:
        peer.close()


@trio_test
async def test_a_server_silent_past_twice_the_heartbeat_is_left_for_the_next() -> None:
    peer = RawPeer()
    try:
        async with connect([peer.url], reconnect=FAST, keepalive=SLOW_PINGS) as client:
            with trio.fail_after(10):
                link, _ = await granted(peer, 200)  # then silent: reads nothing, closes nothing
                down = await next_note(client, NotificationStatus.SERVER_DOWN)
                assert "nothing from the server for 0.4 s" in (down.reason or ""), down
                await granted(peer, 200)  # the next session
                await next_note(client, NotificationStatus.SERVER_UP)
            assert link.pings == 0
    finally:
        peer.close()


@trio_test
async def test_heartbeats_keep_an_idle_session_and_their_end_ends_it() -> None:
    peer = RawPeer()
    try:
        async with connect([peer.url], reconnect=FAST, keepalive=SLOW_PINGS) as client:
            link, _ = await granted(peer, 200)
            await next_note(client, NotificationStatus.SERVER_UP)
            for _ in range(20):  # 2 s: five times the silence that ends a session
                await trio.sleep(0.1)
                link.write(ops.Pong())
            assert client.server is not None
            down = await next_note(client, NotificationStatus.SERVER_DOWN)
            assert "nothing from the server" in (down.reason or ""), down
    finally:
        peer.close()


@trio_test
async def test_a_server_granting_less_than_asked_is_held_to_the_ask() -> None:
    # a broken server's 1 ms would end every session between two of its writes
    peer = RawPeer()
    keepalive = Keepalive(interval=60, timeout=60, heartbeat=0.3)
    try:
        async with connect([peer.url], reconnect=FAST, keepalive=keepalive) as client:
            await granted(peer, 1)
            down = await next_note(client, NotificationStatus.SERVER_DOWN)
            assert "nothing from the server for 0.6 s" in (down.reason or ""), down
    finally:
        peer.close()


@trio_test
async def test_no_silence_limit_without_a_grant_or_without_an_ask() -> None:
    # an older server (no key) and a server granting what nobody asked for: pings alone
    peer = RawPeer()
    try:
        for keepalive, grant in ((SLOW_PINGS, None), (Keepalive(60, 60, heartbeat=None), 100)):
            async with connect([peer.url], reconnect=FAST, keepalive=keepalive) as client:
                await granted(peer, grant)
                await next_note(client, NotificationStatus.SERVER_UP)
                await trio.sleep(1.0)  # 5 and 10 times what a grant would have allowed
                assert client.server is not None
    finally:
        peer.close()


@trio_test
async def test_a_heartbeat_does_not_answer_a_ping() -> None:
    # a server that writes heartbeats but never reads: the ping still finds it out
    peer = RawPeer()
    keepalive = Keepalive(interval=0.2, timeout=0.3, heartbeat=0.1)
    try:
        async with connect([peer.url], reconnect=FAST, keepalive=keepalive) as client:
            link, _ = await granted(peer, 100)
            async with trio.open_nursery() as nursery:

                async def beat() -> None:
                    while True:
                        await trio.sleep(0.05)
                        link.write(ops.Pong())

                nursery.start_soon(beat)
                down = await next_note(client, NotificationStatus.SERVER_DOWN)
                nursery.cancel_scope.cancel()
            assert "no pong" in (down.reason or ""), down
    finally:
        peer.close()


@trio_test
async def test_a_large_frame_being_decoded_is_not_silence(monkeypatch: pytest.MonkeyPatch) -> None:
    # The reader decodes a large frame (in a thread: seconds for a big recovery batch)
    # and trio-websocket reads nothing more meanwhile: the heartbeats behind it wait in
    # the socket. That is the client's own work, not a silent server.
    decode = session_module.decode_server_op

    def slow_decode(payload: bytes) -> ops.ServerOp:
        if len(payload) > session_module.LARGE_FRAME_BYTES:
            time.sleep(1.0)  # (in the worker thread) five times the silence that ends one
        return decode(payload)

    monkeypatch.setattr(session_module, "decode_server_op", slow_decode)
    peer = RawPeer()
    count = 20_000  # about 1.1 MiB
    try:
        async with (
            connect([peer.url], reconnect=FAST, keepalive=SLOW_PINGS, message_buffer=count)
            as client,
            trio.open_nursery() as nursery,
        ):
            subscription = client.subscribe("/a/b")
            link, _ = await granted(peer, 200)
            await link.expect(ops.Subscribe)
            link.write(ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, "/a/b", Position(7, 0)))

            async def beat() -> None:
                while True:
                    await trio.sleep(0.05)
                    link.write(ops.Pong())

            nursery.start_soon(beat)
            link.write(ops.Deliver(tuple(update("/a/b", seq) for seq in range(1, count + 1))))
            got = [(await subscription.next_message()).seq for _ in range(count)]
            assert got == list(range(1, count + 1))
            await trio.sleep(0.5)
            notes = client.notifications()
            statuses = [notes.get_nowait().status for _ in range(notes.pending)]
            assert NotificationStatus.SERVER_DOWN not in statuses, statuses
            nursery.cancel_scope.cancel()
    finally:
        peer.close()


def test_a_client_that_stood_still_does_not_take_it_for_the_servers_silence() -> None:
    # The client's whole process stood still for 1 s (2.5 times the silence that ends a
    # session: a loaded machine, a long collection), and the server's next heartbeat
    # comes just after: the silence watcher, woken late, must not judge a silence it was
    # not running to see. (The watcher alone, on a mock clock: the stall is a jump.)
    session = object.__new__(Session)
    session._progress = WriteProgress()
    session.frames_read = 0
    session._large_frame = False
    ended: list[SessionEnd] = []
    session._finish = lambda end, scope: ended.append(end)  # type: ignore[method-assign]

    async def close_unresponsive(reason: str) -> None:
        pass

    session._close_unresponsive = close_unresponsive  # type: ignore[method-assign]

    async def main() -> None:
        clock = trio.lowlevel.current_clock()
        assert isinstance(clock, MockClock)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session._watch_silence, 0.2, nursery.cancel_scope)
            for _ in range(10):  # a heartbeat every 0.2 s: alive
                await trio.sleep(0.2)
                session._progress.bytes_read += 9
            await trio.sleep(0.05)
            clock.jump(1.0)  # the stall
            await trio.sleep(0)  # the watcher runs first
            await trio.sleep(0.1)
            for _ in range(10):  # the heartbeats go on
                session._progress.bytes_read += 9
                await trio.sleep(0.2)
            assert ended == []
            await trio.sleep(1.0)  # then they stop: a silence seen whole
            assert [end.reason for end in ended] == [
                "nothing from the server for 0.4 s (heartbeat 0.2 s)"]
            nursery.cancel_scope.cancel()

    trio.run(main, clock=MockClock(autojump_threshold=0))
