"""The audit log (JSON lines, one key per category, rotation) and JSON log lines that
name the client."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rawclient import RawClient

from migratory.config import Config
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.server.audit import Audit

SUBJECT = "/audit/test/a"


def read_events(path: Path, until: Any, timeout: float = 10.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        events = [json.loads(line) for line in lines]
        if until(events) or time.monotonic() > deadline:
            return events
        time.sleep(0.05)


def of(events: list[dict[str, Any]], category: str, event: str) -> list[dict[str, Any]]:
    return [e for e in events if e["category"] == category and e["event"] == event]


def test_access_message_and_cache_events(start_server: Any, tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    server = start_server(AuditLogFile=str(audit), AuditAccess="true", AuditMessage="true",
                          AuditCache="true", ServerName="audited",
                          Entitlement="Basic", EntitlementAllowToken="pub-token")
    publisher = RawClient(server.port)
    publisher.connect("pub", token="pub-token")
    first = publisher.publish(Message(SUBJECT, b"one", closure="1"))
    publisher.publish(Message(SUBJECT, b"two", closure="2"))
    reader = RawClient(server.port)
    reader.connect("reader")
    assert reader.publish(Message(SUBJECT, b"x", closure="3")).status is (
        ops.Status.PUBLISH_DENIED
    )
    assert first.position is not None
    reader.subscribe(SUBJECT, position=Position(first.position.epoch, 0))
    reader.recv_ops_until_status(ops.Status.DATA_SYNC)
    reader.subscribe("/migratory/cluster")
    reader.recv_ops_until_status(ops.Status.SUBSCRIBE_DENY)
    reader.close()
    events = read_events(audit, lambda es: of(es, "access", "disconnect"))
    assert all(e["server"] == "audited" and e["time"].endswith("Z") for e in events)
    connects = of(events, "access", "connect")
    assert [(e["client"]["name"], e["outcome"]) for e in connects] == [
        ("pub", "allowed"), ("reader", "allowed")
    ]
    ids = {e["client"]["connection_id"] for e in connects}
    assert len(ids) == 2 and all(e["client"]["peer"].startswith("127.0.0.1:") for e in connects)
    publishes = of(events, "message", "publish")
    assert [(e["client"]["name"], e["outcome"]) for e in publishes] == [
        ("pub", "submitted"), ("pub", "submitted"), ("reader", "PUBLISH_DENIED")
    ]
    assert publishes[0]["subject"] == SUBJECT and publishes[0]["size"] > 0
    subscribes = of(events, "access", "subscribe")
    assert [(e["subject"], e["outcome"]) for e in subscribes] == [
        (SUBJECT, "allowed"), ("/migratory/cluster", "denied")
    ]
    (resume,) = of(events, "cache", "resume")
    assert resume["outcome"] == "sync" and resume["subject"] == SUBJECT
    (disconnect,) = of(events, "access", "disconnect")
    assert disconnect["client"]["name"] == "reader"


def test_categories_that_are_off_write_nothing(start_server: Any, tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    server = start_server(AuditLogFile=str(audit), AuditMessage="true")
    client = RawClient(server.port)
    client.connect("only-messages")
    client.publish(Message(SUBJECT, b"x", closure="1"))
    events = read_events(audit, lambda es: len(es) >= 1)
    assert [(e["category"], e["event"]) for e in events] == [("message", "publish")]


def test_the_audit_file_rotates(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    config = Config.from_mapping({
        "AuditLogFile": str(path), "AuditAccess": "true",
        "AuditLogMaxBytes": "2048", "AuditLogBackups": "2",
    })
    audit = Audit.from_config(config)
    assert audit is not None
    try:
        for number in range(200):
            audit.event("access", "connect", {"name": f"c{number}"}, outcome="allowed")
    finally:
        audit.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    for file in tmp_path.iterdir():
        assert file.stat().st_size <= 2048
        for line in file.read_text().splitlines():
            assert json.loads(line)["event"] == "connect"
    assert Audit.from_config(Config.defaults()) is None  # off by default


def test_json_log_lines_name_the_client(start_server: Any) -> None:
    server = start_server(LogFormat="json", LogLevel="INFO")
    client = RawClient(server.port)
    client.connect("bad-app")
    client.send_payload(b"\xff not cbor")  # an operation error: the server closes it
    client.recv_close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = [json.loads(line) for line in server.log().splitlines() if line.strip()]
        about = [line for line in lines if line.get("client") == "bad-app"]
        if about:
            break
        time.sleep(0.05)
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    (closing,) = about
    assert closing["peer"].startswith("127.0.0.1:") and closing["connection_id"] >= 1
    assert "bad-app" in closing["message"] and f"#{closing['connection_id']}" in (
        closing["message"]
    )


def test_the_http_front_counts_and_audits_denials(start_server: Any, tmp_path: Path) -> None:
    import urllib.request

    from httpclient import HttpClient, SseClient

    audit = tmp_path / "audit.jsonl"
    server = start_server(AuditLogFile=str(audit), AuditAccess="true", AuditMessage="true")
    client = HttpClient(server.port)
    status, _ = client.publish(subject="/migratory/stats/x", content="forged")
    assert status == 403
    status, _ = client.publish(subject=SUBJECT, content="fine")
    assert status == 200
    stream = SseClient(server.port, ["/migratory/cluster", SUBJECT], extra="&client=watcher")
    events = read_events(audit, lambda es: len(of(es, "access", "subscribe")) >= 2)
    stream.close()
    publishes = of(events, "message", "publish")
    assert [(e["subject"], e["outcome"]) for e in publishes] == [
        ("/migratory/stats/x", "PUBLISH_DENIED"), (SUBJECT, "submitted")
    ]
    assert publishes[0]["client"]["peer"].startswith("127.0.0.1:")
    subscribes = of(events, "access", "subscribe")
    assert [(e["subject"], e["outcome"], e["client"]["name"]) for e in subscribes] == [
        ("/migratory/cluster", "denied", "watcher"), (SUBJECT, "allowed", "watcher")
    ]
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/stats", timeout=5) as reply:
        denials = json.loads(reply.read())["entitlement_denials"]
    assert denials == {"publish": 1, "subscribe": 1}


def test_a_refused_publish_whose_subject_utf8_cannot_encode_is_audited(
    start_server: Any, tmp_path: Path
) -> None:
    """POST /publish with a subject holding a lone surrogate (JSON's "\\ud800") is refused
    before it is numbered and audited as refused -- but the audit line, JSON written
    with ensure_ascii=False, could not be encoded to the UTF-8 file: the logging module
    printed a '--- Logging error ---' traceback and the event was lost. Now the line is
    written, the surrogate escaped."""
    from httpclient import HttpClient

    audit = tmp_path / "audit.jsonl"
    server = start_server(AuditLogFile=str(audit), AuditMessage="true")
    client = HttpClient(server.port)
    response, _ = client.request("POST", "/publish",
                                 b'{"subject": "/a/\\ud800", "content": "x"}')
    assert response.status_code == 400
    status, _ = client.publish(subject=SUBJECT, content="after")
    assert status == 200
    client.close()
    events = read_events(audit, lambda events: len(events) >= 2)
    assert [(e["subject"], e["outcome"]) for e in of(events, "message", "publish")] == [
        ("/a/\ud800", "PUBLISH_FAILED"), (SUBJECT, "submitted")]
