"""Heartbeats (migratory/server/heartbeats.py): an idle session that asked for them is
written at least every interval, a busy one never, and the sweep's work per tick is
bounded -- first as bookkeeping driven tick by tick, then over a real socket."""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc
import weakref
from typing import Any

import cbor2
import pytest
from rawclient import RawClient

from migratory.model.message import Message
from migratory.model.outbox import Outbox
from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory.server.heartbeats import (
    HEADROOM,
    HEARTBEAT_FRAME,
    SWEEP_LIMIT,
    Heartbeats,
    HeartbeatStatistics,
)

TICK = 0.1


class FakeSession:
    """A session whose "writer" takes its outbox whenever the test says."""

    def __init__(self) -> None:
        self.outbox = Outbox(batch_space=1 << 16, max_pending=1 << 20)
        self.closing = False
        self.aborted = False
        self.beats = 0
        self.writes = 0
        self.heartbeat_slot: list[Any] | None = None

    def deliver(self, frame: bytes) -> None:
        if frame == HEARTBEAT_FRAME:
            self.beats += 1
        self.outbox.enqueue(frame)

    def write(self) -> None:
        if self.outbox:
            self.outbox.take()
            self.writes += 1


def run(beats: Heartbeats, ticks: int, sessions: list[FakeSession]) -> None:
    """``ticks`` sweeps; each session's outbox written after each."""
    for _ in range(ticks):
        beats.sweep()
        for session in sessions:
            session.write()


def test_the_frame_is_a_pong_without_id() -> None:
    decoder = ws.FrameDecoder(client_frames=False)
    decoder.receive_data(HEARTBEAT_FRAME)
    event = decoder.next_event()
    assert isinstance(event, ws.BinaryMessage)
    assert cbor2.loads(event.data) == {"op": "pong"}
    assert ops.decode_server_op(event.data) == ops.Pong(None)


def test_grant_is_at_least_the_minimum_and_none_unless_asked_or_when_off() -> None:
    beats = Heartbeats(1000, TICK)
    assert beats.grant(None) is None
    assert beats.grant(200) == 1000
    assert beats.grant(2500) == 2500
    assert beats.grant(10**12) == 3_600_000
    assert Heartbeats(0, TICK).grant(2000) is None
    session = FakeSession()
    assert Heartbeats(0, TICK).start(session, 2000) is None


def test_an_idle_session_gets_one_heartbeat_per_interval() -> None:
    beats = Heartbeats(1000, TICK)
    idle = FakeSession()
    assert beats.start(idle, 1000) == 1000
    run(beats, 100, [idle])  # 10 s
    assert idle.beats == 10
    # never silent for longer than the interval: one written at least every 10 ticks
    assert idle.writes == 10


def test_a_busy_session_gets_none_and_an_idle_one_beside_it_does() -> None:
    beats = Heartbeats(1000, TICK)
    busy, idle = FakeSession(), FakeSession()
    beats.start(busy, 1000)
    beats.start(idle, 2000)
    for _ in range(80):  # 8 s
        busy.deliver(b"message")
        beats.sweep()
        busy.write()
        idle.write()
    assert busy.beats == 0
    assert idle.beats == 4  # one per 2 s


def test_a_session_with_bytes_waiting_is_not_sent_more() -> None:
    # its writer is stuck (the client does not read): a heartbeat adds nothing
    beats = Heartbeats(1000, TICK)
    stuck = FakeSession()
    beats.start(stuck, 1000)
    stuck.deliver(b"waiting")
    for _ in range(50):
        beats.sweep()
    assert stuck.beats == 0
    assert len(stuck.outbox) == 1


def test_closed_and_forgotten_sessions_are_dropped() -> None:
    beats = Heartbeats(1000, TICK)
    closing, forgotten, kept = FakeSession(), FakeSession(), FakeSession()
    for session in (closing, forgotten, kept):
        beats.start(session, 1000)
    closing.closing = True
    beats.forget(forgotten)
    assert len(beats) == 2
    run(beats, 30, [closing, forgotten, kept])
    assert (closing.beats, forgotten.beats, kept.beats) == (0, 0, 3)
    assert len(beats) == 1
    looked = beats.looked
    run(beats, 10, [kept])
    assert beats.looked - looked == 2  # only the one left, twice per interval


def test_a_sweep_looks_at_most_sweep_limit_sessions_and_the_rest_next_tick() -> None:
    # 10,000 connected in one tick with one interval all fall due in one tick
    beats = Heartbeats(1000, TICK)
    sessions = [FakeSession() for _ in range(10_000)]
    for session in sessions:
        assert beats.start(session, 2000) == 2000  # (10,000 fit the share at 2 s)
    work = []
    for _ in range(100):  # 10 s
        looked = beats.looked
        beats.sweep()
        for session in sessions:
            session.write()
        work.append(beats.looked - looked)
    assert max(work) == SWEEP_LIMIT
    # each looked at twice per interval (the ones spilled over a tick or two late, so
    # they miss the last round): about 10 looks each, every one beating every 2 s
    assert 9 * 10_000 <= sum(work) <= 10 * 10_000
    assert {session.beats for session in sessions} == {5}


def test_a_crowd_is_granted_longer_intervals_and_each_is_still_kept() -> None:
    # A sweep of 64 sessions a tick (640 looks/s) and 2,000 sessions asking for 2 s,
    # arriving one by one: at 2 s each they would ask for 2,000 looks/s, and the sweep,
    # behind, would look at each every 3.1 s -- an idle session silent for longer than
    # its interval (and, with more, than the twice that its client allows)
    limit = 64
    beats = Heartbeats(1000, TICK, sweep_limit=limit)
    sessions: list[FakeSession] = []
    granted: dict[int, int] = {}
    for number in range(2000):
        session = FakeSession()
        grant = beats.start(session, 2000)
        assert grant is not None
        granted[id(session)] = grant
        sessions.append(session)
        if number % 20 == 19:  # 20 connect per tick: 10 s to connect them all
            run(beats, 1, sessions)
    grants = sorted(granted.values())
    assert grants[0] == 2000  # the first ones get what they asked
    # the last: 2,000 sessions' looks at 640 / HEADROOM a second
    assert grants[-1] == -(-2 * 2000 * HEADROOM * 100 // limit)
    # from now on: ticks between two writes of each idle session
    last: dict[int, int] = {}
    longest = dict.fromkeys(granted, 0)
    looked = beats.looked
    for tick in range(400):  # 40 s
        beats.sweep()
        for session in sessions:
            if session.outbox:
                session.write()
                key = id(session)
                if key in last:
                    longest[key] = max(longest[key], tick - last[key])
                last[key] = tick
    assert all(session.beats >= 2 for session in sessions)
    # a little late at most (sessions due in one tick spill over the next few), far from
    # the twice the interval their clients allow (3.15 times before the grant grew)
    late = sorted(longest[key] * 100 / granted[key] for key in longest
                  if longest[key] * 100 > 1.25 * granted[key])
    assert late == [], f"{len(late)} sessions silent past their interval (x {late[-1]:.2f})"
    assert beats.looked - looked <= 400 * limit


def test_the_grant_grows_with_the_sessions_watched() -> None:
    beats = Heartbeats(1000, TICK, sweep_limit=64)
    assert beats.grant(2000) == 2000
    for _ in range(1000):
        beats.start(FakeSession(), 2000)
    # 1,001 sessions' two looks per interval within 160 looks a second: 12.5 s
    assert beats.grant(2000) == 12513
    assert beats.grant(60_000) == 60_000  # asking for more than the crowd needs: as asked


def test_a_grant_is_never_shorter_than_two_ticks() -> None:
    # the sweep looks at a session at most once a tick, twice per interval: a server
    # configured with ClientHeartbeatMinimum=1 granted 1 ms and wrote every 100-200 ms,
    # and a client holding it to its grant took it for dead 2 ms into every silence
    beats = Heartbeats(1, TICK)
    assert beats.grant(1) == 200
    assert beats.grant(199) == 200
    assert beats.grant(201) == 201
    session = FakeSession()
    beats.start(session, 1)
    run(beats, 20, [session])  # 2 s
    assert session.beats == 10  # one per 200 ms: the interval granted is kept


def test_watching_a_session_keeps_no_object_of_its_own() -> None:
    # issue 13: 10,000 idle connections at most 6 KiB each, with the heartbeats the SDKs
    # ask for. A watch object and a dict entry per session were 94 bytes (tracemalloc)
    sessions = [FakeSession() for _ in range(4000)]
    beats = Heartbeats(1000, TICK)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for session in sessions:
            beats.start(session, 2000)
        watched = tracemalloc.get_traced_memory()[0] - before
        for _ in range(25):  # every one looked at twice, moved to its next lists
            for session in sessions:
                session.outbox.batch_taken = True  # (busy: no heartbeat queued)
            beats.sweep()
        looked = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(beats) == 4000
    # a list entry each (8 bytes, and the list's growth)
    assert watched / 4000 <= 12, f"{watched / 4000:.1f} bytes a session"
    assert looked / 4000 <= 12, f"{looked / 4000:.1f} bytes a session"


def test_a_session_watched_again_or_forgotten_and_watched_is_looked_at_once() -> None:
    beats = Heartbeats(1000, TICK)
    twice, again, other = FakeSession(), FakeSession(), FakeSession()
    beats.start(twice, 1000)
    beats.start(twice, 1000)  # the same list: its first entry moves it, the second is stale
    beats.start(again, 1000)
    beats.forget(again)
    beats.forget(again)  # (twice: counted once)
    beats.start(again, 2000)
    beats.start(other, 1000)
    assert len(beats) == 3
    looked = beats.looked
    run(beats, 100, [twice, again, other])  # 10 s
    assert (twice.beats, again.beats, other.beats) == (10, 5, 10)
    # 20 + 10 + 20 looks, and a stale entry (left or compacted away) looked at once
    assert 20 + 10 + 20 <= beats.looked - looked <= 20 + 10 + 20 + 2
    assert len(beats) == 3


def test_a_closed_session_is_not_held_until_its_list_comes_due() -> None:
    # A client granted an hour is looked at every half hour: its entry in the wheel held
    # the whole session that long after it closed, and a client connecting and closing
    # in a loop had every one of them held meanwhile
    beats = Heartbeats(1000, TICK)
    alone = FakeSession()
    beats.start(alone, 3_600_000)
    gone = weakref.ref(alone)
    beats.forget(alone)
    del alone
    gc.collect()
    assert gone() is None
    # in a list of many (connected in one tick): stale entries at most half of it
    crowd = [FakeSession() for _ in range(100)]
    for session in crowd:
        beats.start(session, 3_600_000)
    refs = [weakref.ref(session) for session in crowd]
    for session in crowd[:80]:
        beats.forget(session)
    kept = crowd[80:]
    del crowd, session
    gc.collect()
    held = sum(ref() is not None for ref in refs)
    assert held <= 2 * len(kept), held  # 20 watched, at most as many closed ones
    run(beats, 2, kept)
    assert len(beats) == 20
    looked = beats.looked
    run(beats, 18_000, kept)  # the half hour: each of the 20 looked at once
    assert beats.looked - looked <= held
    assert {session.beats for session in kept} == {1}


def test_sessions_forgotten_from_the_list_being_swept_leave_the_rest_looked_at() -> None:
    # the list a sweep at its limit is half through is not compacted under it
    beats = Heartbeats(1000, TICK, sweep_limit=10)
    sessions = [FakeSession() for _ in range(100)]
    for session in sessions:
        beats.watch(session, 1000)  # one list, due at tick 5
    run(beats, 5, sessions)  # 10 looked at, 90 overdue
    for session in sessions[10:70]:
        beats.forget(session)
    kept = sessions[:10] + sessions[70:]
    run(beats, 9, kept)  # the rest of the list (90 entries, 10 a sweep)
    assert [session.beats for session in kept] == [1] * 40
    run(beats, 20, kept)
    assert len(beats) == 40 and beats.statistics().overdue == 0


def test_the_statistics_say_what_was_sent_and_how_far_behind_the_sweep_is() -> None:
    beats = Heartbeats(1000, TICK, sweep_limit=100)
    sessions = [FakeSession() for _ in range(350)]
    for session in sessions:
        beats.watch(session, 1000)  # all due at tick 5, then every 5 ticks
    assert beats.statistics() == HeartbeatStatistics(350, 0, 0, 0, 0, 0.0)
    run(beats, 5, sessions)
    # tick 5: 100 looked at (and sent one: nothing written since they connected), 250
    # overdue, due this tick: no lag yet
    assert beats.statistics() == HeartbeatStatistics(350, 100, 100, 0, 250, 0.0)
    run(beats, 1, sessions)
    assert beats.statistics() == HeartbeatStatistics(350, 200, 200, 100, 150, 0.1)
    run(beats, 1, sessions)
    figures = beats.statistics()
    assert (figures.looks, figures.looks_late, figures.overdue) == (300, 200, 50)
    assert figures.lag_seconds == pytest.approx(0.2)
    run(beats, 1, sessions)
    assert beats.statistics() == HeartbeatStatistics(350, 350, 350, 250, 0, 0.0)
    run(beats, 10, sessions)  # a look that finds the last one written, then one more
    assert beats.statistics().sent == 700 == sum(session.beats for session in sessions)
    sessions[0].closing = True
    beats.forget(sessions[1])
    assert len(beats) == 349
    run(beats, 10, sessions)
    assert beats.statistics().sessions == 348


# --- over a real socket ------------------------------------------------------------


def frames(client: RawClient, count: int) -> list[dict[str, Any]]:
    out = []
    for _ in range(count):
        event = client.recv_event(timeout=10)
        assert isinstance(event, ws.BinaryMessage), event
        out.append(cbor2.loads(event.data))
    return out


def test_a_client_that_asks_is_granted_and_sent_heartbeats(start_server: Any) -> None:
    server = start_server(ClientHeartbeatMinimum="500")
    client = RawClient(server.port)
    client.send_op(ops.Connect(client="beating", heartbeat_ms=200))
    connected = client.recv_op()
    assert connected == ops.Connected(
        connected.server, ops.PROTOCOL_VERSION, connected.max_subjects_per_subscribe, 500)
    assert frames(client, 3) == [{"op": "pong"}] * 3


def test_a_client_that_does_not_ask_gets_none(start_server: Any) -> None:
    # (an older client: a pong it did not ask for would be a pong without a ping)
    server = start_server(ClientHeartbeatMinimum="500")
    client = RawClient(server.port)
    assert client.connect("older").heartbeat_ms is None
    time.sleep(1.6)  # three intervals of the one that asked
    client.send_op(ops.Ping(5))
    assert frames(client, 1) == [{"op": "pong", "id": 5}]


def test_a_server_with_heartbeats_off_grants_none(start_server: Any) -> None:
    server = start_server(ClientHeartbeatMinimum="0")
    client = RawClient(server.port)
    client.send_op(ops.Connect(client="asks", heartbeat_ms=500))
    connected = client.recv_op()
    assert isinstance(connected, ops.Connected)
    assert connected.heartbeat_ms is None


def test_a_subscriber_receiving_messages_gets_no_heartbeat(start_server: Any) -> None:
    server = start_server(ClientHeartbeatMinimum="1000")
    subscriber = RawClient(server.port)
    subscriber.send_op(ops.Connect(client="busy", heartbeat_ms=1000))
    assert isinstance(subscriber.recv_op(), ops.Connected)
    subscriber.subscribe("/a/b")
    assert frames(subscriber, 1)[0]["status"] == "SUBSCRIBE_ALLOW"
    publisher = RawClient(server.port)
    publisher.connect("publisher")
    count = 60

    def publish() -> None:
        for i in range(count):  # 20 a second for 3 s: three intervals
            publisher.send_op(ops.Publish(Message("/a/b", str(i).encode())))
            time.sleep(0.05)

    thread = threading.Thread(target=publish)
    thread.start()
    got = frames(subscriber, count)
    thread.join()
    assert [body["op"] for body in got] == ["message"] * count
    # once the messages stop, it beats again
    assert frames(subscriber, 1) == [{"op": "pong"}]
