"""The HTTP and MQTT publishers of the chaos workload (chaos/http_publisher.py,
chaos/mqtt_publisher.py): the HTTP exchange (bytes in, answers out: whole, a byte at a
time, with the next answer behind), what each answer records, and the MQTT ledger that
matches PUBACKs to publishes. The real runs: tests/chaos/test_chaos_scenarios.py (the
light load has one of each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from offline_workload import history_rows, offline_workload

from chaos import __main__ as cli
from chaos.http_publisher import Answer, ConnectionEnded, PublishExchange, outcome
from chaos.mqtt_publisher import PublishLedger
from chaos.plan import plan_workload
from chaos.workload import PUBLISH_TIMEOUT


def _answer(status: int, body: dict[str, object], *, close: bool = False) -> bytes:
    data = json.dumps(body).encode()
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(data)}\r\n" + ("Connection: close\r\n" if close else "")
    return head.encode() + b"\r\n" + data


OK = {"status": "PUBLISH_OK", "subject": "/chaos/s1", "epoch": 81, "seq": 7}


def _feed(exchange: PublishExchange, data: bytes, *, bytewise: bool) -> list[Answer]:
    chunks = [data[i : i + 1] for i in range(len(data))] if bytewise else [data]
    return [a for chunk in chunks if (a := exchange.receive_data(chunk)) is not None]


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "byte-at-a-time"])
def test_the_exchange_posts_json_and_reads_answers_in_turn_on_one_connection(
    bytewise: bool,
) -> None:
    exchange = PublishExchange("127.0.0.1:8800")
    request = exchange.request("/chaos/s1", b"p0-1|chaos", {"msg_id": "p0-1"}, True, False)
    head, _, body = request.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /publish HTTP/1.1\r\n")
    assert json.loads(body) == {"subject": "/chaos/s1", "content": "p0-1|chaos",
                                "fields": {"msg_id": "p0-1"}, "retained": True,
                                "qos": "standard"}
    assert _feed(exchange, _answer(200, OK), bytewise=bytewise) == [Answer(200, OK, True)]
    exchange.request("/chaos/s1", b"p0-2|chaos", {}, False, True)  # the same connection
    refused = {"status": "PUBLISH_FAILED", "reason": "cluster unavailable"}
    assert _feed(exchange, _answer(503, refused, close=True), bytewise=bytewise) == [
        Answer(503, refused, False)]


def test_an_answer_cut_by_the_connections_end_is_no_answer() -> None:
    exchange = PublishExchange("h")
    exchange.request("/chaos/s1", b"p0-1|chaos", {}, False, True)
    whole = _answer(200, OK)
    assert exchange.receive_data(whole[:-3]) is None
    with pytest.raises(ConnectionEnded, match="no answer: peer closed connection"):
        exchange.receive_data(b"")


def test_garbage_for_an_answer_is_a_protocol_error() -> None:
    exchange = PublishExchange("h")
    exchange.request("/chaos/s1", b"p0-1|chaos", {}, False, True)
    with pytest.raises(ConnectionEnded, match="no answer"):
        exchange.receive_data(b"\x00\x01 not http\r\n\r\n")


@pytest.mark.parametrize(("answer", "row"), [
    (Answer(200, OK, True), ("ok", {"epoch": 81, "seq": 7})),
    (Answer(200, {"status": "PUBLISH_OK"}, True),  # no position: not an ok to hold it to
     ("fail", {"reason": "HTTP 200 PUBLISH_OK: "})),
    (Answer(403, {"status": "PUBLISH_DENIED", "reason": "listener role subscribe"}, True),
     ("fail", {"reason": "HTTP 403 PUBLISH_DENIED: listener role subscribe"})),
    (Answer(502, {}, False), ("fail", {"reason": "HTTP 502 no status: "})),
])
def test_each_answer_makes_its_row(answer: Answer, row: tuple[str, dict[str, object]]) -> None:
    assert outcome(answer) == row


def test_the_ledger_matches_pubacks_early_late_and_after_the_connection(tmp_path: Path) -> None:
    w = offline_workload(tmp_path)
    ledger = PublishLedger(w, "pm0", "migratory-1")
    ledger.puback(1)  # paho's callback before publish() returned the mid
    ledger.sent(1, "pm0-1", "/chaos/s1", 10.0)
    ledger.sent(2, "pm0-2", "/chaos/s1", 10.5)
    ledger.sent(3, "pm0-3", "/chaos/s2", 11.0)
    ledger.puback(2)
    ledger.expire(11.0 + PUBLISH_TIMEOUT + 0.1)  # 3 waited too long
    ledger.sent(4, "pm0-4", "/chaos/s2", 20.0)
    ledger.unknown("connection lost before the PUBACK")
    ledger.sent(5, "pm0-5", "/chaos/s2", 21.0)  # entered after the connection went
    rows = [(r["type"], r["msg_id"], r["member"], r["reason"])
            for r in history_rows(w, "publishes")]
    assert rows == [
        ("ok", "pm0-1", "migratory-1", None),
        ("ok", "pm0-2", "migratory-1", None),
        ("info", "pm0-3", "migratory-1", f"no PUBACK in {PUBLISH_TIMEOUT} s"),
        ("info", "pm0-4", "migratory-1", "connection lost before the PUBACK"),
        ("info", "pm0-5", "migratory-1", "connection lost before the PUBACK"),
    ]
    assert [m for _, m in w.acked["/chaos/s1"]] == ["pm0-1", "pm0-2"]  # owed to subscribers


def test_http_and_mqtt_publishers_join_the_plan_and_share_the_rate() -> None:
    plan = plan_workload(5, members=3, rate=120, sdk_publishers=1, raw_publishers=1,
                         http_publishers=2, mqtt_publishers=2)
    assert [(p.name, p.kind, p.prefer) for p in plan.publishers] == [
        ("p0", "sdk", 0), ("pr0", "raw", 1), ("ph0", "http", 2), ("ph1", "http", 0),
        ("pm0", "mqtt", 1), ("pm1", "mqtt", 2)]
    assert {p.rate for p in plan.publishers} == {20.0}
    # the plan of the other clients does not change with them
    assert plan_workload(5, members=3, http_publishers=2).subscribers == plan_workload(
        5, members=3).subscribers
    with pytest.raises(ValueError, match="at least one publisher"):
        plan_workload(5, members=3, sdk_publishers=0, raw_publishers=0)
    assert plan_workload(5, members=3, sdk_publishers=0, raw_publishers=0,
                         http_publishers=1).publishers[0].name == "ph0"


def test_the_options_reach_the_runner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    got: list[dict[str, object]] = []
    monkeypatch.setattr("chaos.runner.run", lambda **kw: got.append(kw) or 0)
    base = ["run", "--seed", "1", "--duration", "5", "--out", str(tmp_path)]
    assert cli.main(base) == 0
    assert cli.main([*base, "--http-publishers", "2", "--mqtt-publishers", "3"]) == 0
    assert [(kw["http_publishers"], kw["mqtt_publishers"]) for kw in got] == [(0, 0), (2, 3)]
