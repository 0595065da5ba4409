"""Plain HTTP on the client port: ``/snapshot``, ``/healthz``, ``/readyz``, the
JavaScript client at ``/client/migratory.js``, and ``/cluster``, ``/stats``, ``/metrics``
unless a monitoring listener serves those (``migratory.server.monitor``). ``/publish``
and ``/events`` live in ``http_front``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import quote

from migratory.entitlement_decisions import ClientIdentity
from migratory.model.message import Message
from migratory.model.subject import InvalidSubjectError, reserved, validate_subject
from migratory.protocol.http import Request
from migratory.protocol.http_api import json_body, message_json, query_problem
from migratory.server.context import ServerContext
from migratory.server.web_assets import CLIENT_ASSETS, serve_asset

JSON = "application/json"
MONITORING = frozenset({"/healthz", "/readyz", "/cluster", "/metrics", "/stats"})


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    raw: bytes = b""  # a complete response built elsewhere (Connection: close)


def error(status: int, reason: str, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(status, (reason + "\n").encode(), headers=headers)


def route(ctx: ServerContext, request: Request, peer: str, *, api: bool) -> Reply:
    """``api``: the listener speaks the HTTP API (``/snapshot``, the JavaScript client);
    monitoring paths always."""
    if request.path not in MONITORING and not api:
        return error(404, f"no such path {request.path!r} on this listener (ListenerRoles)")
    if request.method not in ("GET", "HEAD"):
        return error(405, f"method {request.method} not allowed; use GET", (("Allow", "GET"),))
    if request.path == "/snapshot" and api:
        return snapshot(ctx, request, peer)
    if request.path == "/healthz":
        return Reply(200, b"ok\n")
    if request.path == "/readyz":
        reason = ctx.readiness()
        return Reply(200, b"ready\n") if reason is None else error(503, reason)
    monitoring = None if ctx.monitor is None else ctx.monitor.route(
        request, monitoring_listener=False
    )
    if monitoring is not None:
        return Reply(0, raw=monitoring)  # a complete response (Connection: close)
    asset = serve_asset(CLIENT_ASSETS, request.path)
    if asset is not None:
        return Reply(0, raw=asset)
    if request.path == "/dashboard" or request.path.startswith("/dashboard/"):
        return error(404, "the dashboard is served on the monitoring listener: set MonitorListen "
                          "and MonitorToken (docs/monitoring.md)")
    return error(404, f"no such path {request.path!r}; try /snapshot?subject=/a/b")


def wants_json(request: Request) -> bool:
    return request.query.get("format") == "json" or JSON in (request.header("accept") or "")


def snapshot(ctx: ServerContext, request: Request, peer: str) -> Reply:
    """``GET /snapshot?subject=X[&token=U][&format=json]``: the subject's snapshot.

    The content as the body, its position and fields in ``X-Migratory-*`` headers;
    with ``format=json`` (or ``Accept: application/json``) the whole message as JSON.
    """
    problem = query_problem("/snapshot", request.params)
    if problem is not None:
        return error(400, problem)
    subject = request.query.get("subject")
    if subject is None:
        return error(400, "missing query parameter 'subject'")
    try:
        validate_subject(subject)
    except InvalidSubjectError as exc:
        return error(400, str(exc))
    refusal = reserved(subject)
    if refusal is not None:
        return error(403, refusal)
    identity = ClientIdentity(name="http", token=request.query.get("token"), peer=peer)
    if not ctx.entitlement.allow_connect(identity):  # each request connects, as /events
        ctx.stats.count(ctx.stats.entitlement_denials, "connect")
        return error(403, "entitlement refused the connection")
    if not ctx.entitlement.allow_subscribe(identity, subject):
        ctx.stats.count(ctx.stats.entitlement_denials, "subscribe")
        return error(403, f"not entitled to subscribe to {subject!r}")
    message = ctx.hub.snapshot(subject)
    if message is None:
        return error(404, f"no snapshot for {subject!r}")
    as_json = wants_json(request)
    replies = ctx.snapshot_replies
    kept = replies.get((subject, as_json))
    if kept is not None and kept[0] is message:  # the same snapshot: encoded once
        same: Reply = kept[1]
        return same
    reply = _snapshot_reply(subject, message, as_json)
    replies[(subject, as_json)] = (message, reply)
    if len(replies) > SNAPSHOT_REPLIES:
        del replies[next(iter(replies))]  # the oldest kept
    return reply


SNAPSHOT_REPLIES = 64
"""Snapshot replies kept (ServerContext.snapshot_replies): a snapshot of 20,000 fields
was JSON-encoded again for every GET /snapshot, ~4-10 ms of the event loop each
(docs/benchmarks.md, "What held", snapshot-fields)."""


def subject_header(subject: str) -> str:
    """``X-Migratory-Subject``: the subject percent-encoded as in a URL's path (UTF-8;
    white space, ``%``, DEL and what is not ASCII escaped). The subject's UTF-8 bytes as
    they were made a header h11 refuses for a subject that ends or starts with a space
    (``/a/b ``, a valid subject): GET /snapshot answered 500 and closed the connection."""
    return quote(subject, safe="/!$&'()*+,;=:@")


FIELDS_HEADER_BYTES = 8192
"""The most a raw snapshot's ``X-Migratory-Fields`` header carries (its JSON is ASCII):
with the subject's header (up to ~3 KiB percent-encoded) and the others, the reply's
headers stay within Node's 16 KiB (its http parser refuses more: HPE_HEADER_OVERFLOW),
far within curl's 100 KiB a header. Fields up to MaxMessageSize (128 KiB by default)
went into it before. More: 406, pointing to ``format=json`` (docs/http.md)."""


def _snapshot_reply(subject: str, message: Message, as_json: bool) -> Reply:
    if as_json:
        return Reply(200, json_body(message_json(message)), JSON)
    fields = json.dumps(dict(message.fields), sort_keys=True)  # (ensure_ascii: bytes)
    if len(fields) > FIELDS_HEADER_BYTES:
        return error(406, f"the snapshot of {subject!r} has {len(fields):,} bytes of fields "
                          f"as JSON, more than the X-Migratory-Fields header carries "
                          f"({FIELDS_HEADER_BYTES:,}): ask it with format=json (or Accept: "
                          "application/json), which gives the whole message")
    headers = (
        ("X-Migratory-Subject", subject_header(subject)),
        ("X-Migratory-Epoch", str(message.epoch)),
        ("X-Migratory-Seq", str(message.seq)),
        ("X-Migratory-Fields", fields),
    )
    return Reply(200, message.content, "application/octet-stream", headers)
