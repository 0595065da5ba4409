"""GET /snapshot (migratory/server/http_routes.py): a snapshot's reply is encoded once and
served again while the snapshot is the same object."""

from __future__ import annotations

import json

import pytest
from test_mqtt_session import make

from migratory.model.message import Message
from migratory.protocol.http import Request
from migratory.server import http_routes

SUBJECT = "/Snap/x"


def get(query: str) -> Request:
    path = "/snapshot"
    params = tuple(tuple(p.split("=", 1)) for p in query.split("&"))
    return Request("GET", f"{path}?{query}", path, dict(params), (("host", "x"),),
                   params=params)  # type: ignore[arg-type]


def test_a_snapshot_is_encoded_once_until_it_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot of 2,000 fields asked 10 times over each format: its fields were
    JSON-encoded for every request (20 times; at 20,000 fields, 9.3 ms of server CPU per
    request with h11's checks, docs/benchmarks.md). Now once per format, and again once
    a retained publish changed the snapshot."""
    ctx, _ = make()
    encoded = [0]
    dumps = json.dumps

    class CountingJson:
        @staticmethod
        def dumps(*args: object, **kw: object) -> str:
            encoded[0] += 1
            return dumps(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(http_routes, "json", CountingJson)
    monkeypatch.setattr("migratory.protocol.http_api.json", CountingJson, raising=False)
    ctx.hub.publish(Message(SUBJECT, b"1", {f"f{i}": "v" for i in range(2000)}, retained=True),
                    0.0)
    for query in (f"subject={SUBJECT}", f"subject={SUBJECT}&format=json"):
        replies = [http_routes.route(ctx, get(query), "127.0.0.1:1", api=True) for _ in range(10)]
        assert all(r.status == 200 for r in replies) and len({id(r) for r in replies}) == 1
    assert encoded[0] <= 2
    ctx.hub.publish(Message(SUBJECT, b"2", {"f0": "w"}, retained=True), 0.0)
    reply = http_routes.route(ctx, get(f"subject={SUBJECT}"), "127.0.0.1:1", api=True)
    assert reply.body == b"2"
    assert json.loads(dict(reply.headers)["X-Migratory-Fields"])["f0"] == "w"
