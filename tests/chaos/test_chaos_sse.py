"""SSE subscribers of the chaos workload (chaos/sse_workload.py): the event-stream reader
(bytes in, events out, whole and a byte at a time), the recorder's history rows, the plan,
the members' heartbeats and the ``--sse-subscribers`` option. No member process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from offline_workload import history_rows, offline_workload

from chaos import __main__ as cli
from chaos.plan import SubscriberPlan, plan_workload
from chaos.sse_workload import Ended, Event, EventStream, Head, SseRecorder, stall_after
from chaos.workload import Workload
from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import sse

S0, S1 = "/chaos/s0", "/chaos/s1"


def _message(subject: str, seq: int, kind: MessageType = MessageType.UPDATE) -> Message:
    return Message(subject, f"p0-{seq}|chaos".encode(), {}, False, epoch=7, seq=seq, type=kind)


def _stream_bytes() -> tuple[bytes, bytes]:
    """What a member writes for a resumed two-subject stream (the server's own encoders),
    and an event cut in the middle by the connection's end."""
    p = [Position(7, 2), Position(7, 5)]
    body = sse.retry(1500) + sse.comment()
    body += sse.event("subscribe", {"subject": S0}) + sse.event_id(p)
    body += sse.message_lines(_message(S0, 3, MessageType.RECOVERED)) + sse.event_id(
        [Position(7, 3), p[1]])
    body += sse.event("sync", {"subject": S0, "epoch": 7, "seq": 3}) + sse.event_id(
        [Position(7, 3), p[1]])
    body += sse.event("resync", {"subject": S1, "epoch": 7, "seq": 9}) + sse.event_id(
        [Position(7, 3), Position(7, 9)])
    body += sse.message_lines(_message(S1, 9, MessageType.SNAPSHOT)) + sse.event_id(
        [Position(7, 3), Position(7, 9)])
    body += sse.comment() + sse.message_lines(_message(S0, 4)) + sse.event_id(
        [Position(7, 4), Position(7, 9)])
    cut = sse.message_lines(_message(S0, 5)) + b"id:7:5,7:9\n"  # no blank line: not dispatched
    return sse.stream_head() + body, cut


def _read(stream: EventStream, data: bytes, *, bytewise: bool) -> list[Any]:
    chunks = [data[i : i + 1] for i in range(len(data))] if bytewise else [data]
    return [item for chunk in chunks for item in stream.receive_data(chunk)]


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "byte-at-a-time"])
def test_the_reader_dispatches_events_and_keeps_the_last_dispatched_id(bytewise: bool) -> None:
    stream = EventStream("7:2,7:5")
    request = stream.request("127.0.0.1:8800", [S0, S1], "e0")
    assert request.startswith(
        b"GET /events?subject=%2Fchaos%2Fs0&subject=%2Fchaos%2Fs1&client=e0 HTTP/1.1\r\n")
    assert b"\r\nLast-Event-ID: 7:2,7:5\r\n" in request
    whole, cut = _stream_bytes()
    items = _read(stream, whole + cut, bytewise=bytewise) + stream.receive_data(b"")
    assert items[0] == Head(200) and items[-1] == Ended("closed by the server")
    events = items[1:-1]
    assert [(e.type, e.last_id) for e in events] == [
        ("subscribe", "7:2,7:5"),
        ("message", "7:3,7:5"),
        ("sync", "7:3,7:5"),
        ("resync", "7:3,7:9"),
        ("message", "7:3,7:9"),
        ("message", "7:4,7:9"),
    ]
    assert json.loads(events[-1].data)["seq"] == 4
    assert stream.last_id == "7:4,7:9"  # the cut event's id is not taken
    assert stream.retry == 1.5 and stream.ended
    assert stream.receive_data(b"more") == []


def test_the_reader_takes_cr_and_crlf_line_ends_and_no_id_without_one() -> None:
    stream = EventStream()
    assert b"Last-Event-ID" not in stream.request("h", [S0], "e1")
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    body = b"data: {\"a\": 1}\r\nid: 1:1\r\n\r\ndata:{}\rid:1:2\r"
    items = _read(stream, head + body, bytewise=True)
    assert items == [Head(200), Event("message", '{"a": 1}', "1:1")]  # the lone CR waits
    assert stream.receive_data(b"\r\n") == [Event("message", "{}", "1:2")]


def test_an_answer_other_than_200_is_a_head_and_an_end_and_no_event() -> None:
    stream = EventStream("7:2")
    stream.request("h", [S0], "e0")
    body = b'{"error": "not ready"}'
    answer = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert stream.receive_data(answer) == [Head(503), Ended("closed by the server")]
    assert stream.last_id == "7:2" and stream.retry is None
    garbage = EventStream()
    garbage.request("h", [S0], "e0")
    (end,) = garbage.receive_data(b"SPDY/9 what\r\n\r\n")
    assert isinstance(end, Ended) and end.reason.startswith("bad HTTP")


def _workload(tmp_path: Path) -> Workload:
    return offline_workload(tmp_path, sse_subscribers=1)


_rows = history_rows


def test_bytes_in_history_rows_out(tmp_path: Path) -> None:
    w = _workload(tmp_path)
    spec = SubscriberPlan("e0", "sse", 1, (S0, S1), 0, 0.0)
    rec = SseRecorder(w, spec)
    stream = EventStream("7:2,7:5")
    stream.request("h", [S0, S1], "e0")
    whole, _ = _stream_bytes()
    whole += sse.event("close", {"code": 1001, "reason": "shutdown"}) + sse.event_id([None, None])
    for i, item in enumerate(_read(stream, whole, bytewise=False)):
        if isinstance(item, Head):
            rec.up([S0, S1], "migratory-1", 1.0)
        elif isinstance(item, Event):
            rec.event(item, "migratory-1", 1.0 + i / 100)
    rec.event(Event("message", "not json", "x"), "migratory-1", 1.5)  # said, not recorded
    rec.down("migratory-1", "closed", 2.0)
    dels = [(d["kind"], d["subject"], d["epoch"], d["seq"], d["msg_id"], d["type"], d["member"])
            for d in _rows(w, "deliveries")]
    assert dels == [
        ("sse", S0, 7, 3, "p0-3", "recovered", "migratory-1"),
        ("sse", S1, 7, 9, "p0-9", "snapshot", "migratory-1"),
        ("sse", S0, 7, 4, "p0-4", "update", "migratory-1"),
    ]
    subs = [(r["kind"], r["subject"], r["event"], r["epoch"], r["seq"], r["time"])
            for r in _rows(w, "subscriptions")]
    assert subs == [
        ("sse", None, "SERVER_UP", None, None, 1.0),
        ("sse", S0, "subscribed", None, None, 1.0),
        ("sse", S1, "subscribed", None, None, 1.0),
        ("sse", S0, "SUBSCRIBE_ALLOW", None, None, 1.01),
        ("sse", S0, "DATA_SYNC", 7, 3, 1.03),
        ("sse", S1, "DATA_RESYNC", 7, 9, 1.04),
        ("sse", None, "SERVER_DOWN", None, None, 2.0),
    ]
    assert rec.closes == ["1001: shutdown"]
    assert w.seen["e0"] == {"p0-3", "p0-4", "p0-9"} and w.subscribed_at["e0"] == 1.0
    assert w.stats["deliveries"] == 3
    # what the drain of a Standard run reads (Workload.drained): the resync, the last delivery
    assert w.resynced == {("e0", S1): 1.04} and w.last_delivery == 1.06
    w.h.close()


def test_sse_subscribers_join_the_plan_without_changing_the_others() -> None:
    base = plan_workload(5, members=5, mqtt_subscribers=2)
    more = plan_workload(5, members=5, mqtt_subscribers=2, sse_subscribers=4)
    assert more.subscribers[: len(base.subscribers)] == base.subscribers
    streams = more.subscribers[len(base.subscribers):]
    assert [s.name for s in streams] == ["e0", "e1", "e2", "e3"]
    assert {s.kind for s in streams} == {"sse"} and all(s.history == 0 for s in streams)
    assert set().union(*(s.subjects for s in streams)) == set(more.subjects)
    assert [s.start_after > 0 for s in streams] == [False, False, True, False]


def test_members_get_heartbeats_every_second_only_with_sse_subscribers(tmp_path: Path) -> None:
    from chaos.runner import Runner

    def heartbeats(**kw: Any) -> set[str | None]:
        runner = Runner(seed=1, duration=5, out=tmp_path / str(len(kw)), members=3, **kw)
        runner.h.close()
        return {m.settings.get("SseHeartbeatInterval") for m in runner.members}

    assert heartbeats() == {None}
    assert heartbeats(sse_subscribers=2) == {"1"}
    assert heartbeats(sse_subscribers=2, settings={"SseHeartbeatInterval": "4"}) == {"4"}
    assert stall_after(1) == 3 and stall_after(4) == 9


def test_the_option_reaches_the_runner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import chaos.runner

    got: list[dict[str, Any]] = []
    monkeypatch.setattr(chaos.runner, "run", lambda **kw: got.append(kw) or 0)
    base = ["run", "--seed", "1", "--duration", "5", "--out", str(tmp_path / "r")]
    assert cli.main(base) == 0
    assert cli.main([*base, "--sse-subscribers", "3"]) == 0
    assert [kw["sse_subscribers"] for kw in got] == [0, 3]
