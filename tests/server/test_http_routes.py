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
    for query, status in ((f"subject={SUBJECT}", 406), (f"subject={SUBJECT}&format=json", 200)):
        # (raw: 406, its fields past FIELDS_HEADER_BYTES -- made once all the same)
        replies = [http_routes.route(ctx, get(query), "127.0.0.1:1", api=True) for _ in range(10)]
        assert all(r.status == status for r in replies) and len({id(r) for r in replies}) == 1
    assert encoded[0] <= 2
    ctx.hub.publish(Message(SUBJECT, b"2", {"f0": "w"}, retained=True), 0.0)
    reply = http_routes.route(ctx, get(f"subject={SUBJECT}&format=json"), "127.0.0.1:1",
                              api=True)
    assert json.loads(reply.body)["content"] == "2"
    assert json.loads(reply.body)["fields"]["f0"] == "w"


def fields_of_json_size(size: int) -> dict[str, str]:
    """Fields whose X-Migratory-Fields JSON is exactly ``size`` bytes (``{"f": "v..."}``)."""
    fields = {"f": ""}
    fields["f"] = "v" * (size - len(json.dumps(fields)))
    assert len(json.dumps(fields, sort_keys=True).encode()) == size
    return fields


def test_a_raw_snapshot_whose_fields_header_would_pass_8_kib_points_to_format_json() -> None:
    """Raw GET /snapshot put all the fields in one X-Migratory-Fields header, up to
    MaxMessageSize (128 KiB by default): past Node's 16 KiB of headers (a reply it
    refuses, HPE_HEADER_OVERFLOW) and curl's 100 KiB per header. Before, fields of
    100,000 bytes of JSON came as a 200 with that header. Now fields of more than
    FIELDS_HEADER_BYTES (8 KiB: the subject's header, up to ~3 KiB percent-encoded, and
    the rest fit Node's 16 KiB) are answered 406 saying to ask format=json, which
    gives them all; at 8 KiB exactly, the raw reply as before."""
    ctx, _ = make()
    assert http_routes.FIELDS_HEADER_BYTES == 8192
    for size, subject in ((8192, "/Snap/fits"), (8193, "/Snap/over"), (100_000, "/Snap/big")):
        ctx.hub.publish(Message(subject, b"c", fields_of_json_size(size), retained=True), 0.0)
    fits = http_routes.route(ctx, get("subject=/Snap/fits"), "127.0.0.1:1", api=True)
    assert fits.status == 200 and fits.body == b"c"
    assert len(dict(fits.headers)["X-Migratory-Fields"]) == 8192
    for subject, size in (("/Snap/over", 8193), ("/Snap/big", 100_000)):
        raw = http_routes.route(ctx, get(f"subject={subject}"), "127.0.0.1:1", api=True)
        assert raw.status == 406, (subject, raw.status)
        said = raw.body.decode()
        assert "format=json" in said and f"{size:,}" in said and "8,192" in said
        assert "X-Migratory-Fields" not in dict(raw.headers)
        whole = http_routes.route(ctx, get(f"subject={subject}&format=json"), "127.0.0.1:1",
                                  api=True)
        assert whole.status == 200
        assert json.loads(whole.body)["fields"] == fields_of_json_size(size)


@pytest.mark.parametrize("path", ["/dashboard", "/dashboard/", "/dashboard/config.json"])
def test_the_dashboard_asked_on_a_client_port_points_to_the_monitoring_listener(
    path: str,
) -> None:
    """README: without npm "the server runs and says so at /dashboard/" -- on the client
    port (the default, no MonitorListen) it said "no such path '/dashboard/'; try
    /snapshot?subject=/a/b": the dashboard is the monitoring listener's."""
    ctx, _ = make()
    request = Request("GET", path, path, {}, (("host", "x"),))
    reply = http_routes.route(ctx, request, "127.0.0.1:1", api=True)
    assert (reply.status, reply.body) == (404, (
        b"the dashboard is served on the monitoring listener: set MonitorListen and "
        b"MonitorToken (docs/monitoring.md)\n"))
