"""docs/http.md and the HTTP API's code say the same: the publish body's keys, the query
parameters each path takes, the HTTP status of each publish status, and the
Server-Sent Events bytes the page shows. In process, no server.

Before: nothing compared them (docs/cli.md, docs/config.md and docs/protocol.md had
their tests; this page had none)."""

from __future__ import annotations

import re
from pathlib import Path

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import http_api, ops, sse

DOC = (Path(__file__).resolve().parents[2] / "docs" / "http.md").read_text()


def table(header: str) -> list[list[str]]:
    """The rows of the table whose header line starts with ``header``, cell by cell."""
    lines = DOC.split(f"\n{header}", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]


def test_the_publish_body_keys_are_the_documented_ones() -> None:
    documented = {re.fullmatch(r"`(\w+)`", row[0])[1] for row in table("| Key | Type |")}  # type: ignore[index]
    assert documented == set(http_api._KEYS)


def test_the_query_parameters_of_each_path_are_the_documented_ones() -> None:
    requests = {row[0]: row[0] for row in table("| Request | Answer |")}
    for path, known in http_api.QUERY_PARAMETERS.items():
        (request,) = [r for r in requests if re.match(rf"`(GET|POST) {path}\b", r)]
        documented = set(re.findall(r"[?&](\w+)=", request))
        if path == "/events":  # told below the table: "&lastEventId=… instead of the header"
            assert "`&lastEventId=…`" in DOC
            documented.add("lastEventId")
        assert documented == set(known), path
    assert http_api.FORMATS == ("json",) and "&format=json]" in DOC


def test_each_publish_status_has_its_documented_http_status() -> None:
    rows = [(re.match(r"`(\w+)`", status)[1], int(code))  # type: ignore[index]
            for status, code in table("| Status | HTTP |")]
    for status, code in rows:
        refused = status == "PUBLISH_FAILED" and code == 400  # (before publishing)
        reply = ops.PublishStatus(ops.Status(status), None, "/a/b", None, "why")
        assert http_api.publish_reply(reply, refused=refused)[0] == code, status
    assert {status for status, _ in rows} == {str(s) for s in http_api.STATUS_CODES}


def test_the_event_stream_example_is_what_a_stream_is_written() -> None:
    (example,) = re.findall(r"```text\n(.*?)```", DOC, re.S)
    message = Message("/Stocks/NYSE/IBM", b"171.5", epoch=8123, seq=12)
    position = Position(8123, 12)
    written = (
        sse.message_lines(message) + sse.event_id([message])
        + sse.event("sync", {"subject": "/Stocks/NYSE/IBM", "epoch": 8123, "seq": 12})
        + sse.event_id([position])
    )
    assert example + "\n" == written.decode()
