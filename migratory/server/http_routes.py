"""Plain HTTP on the client port: ``/snapshot``, ``/healthz``, ``/readyz``, the
JavaScript client at ``/client/migratory.js``, and ``/cluster``, ``/stats``, ``/metrics``
unless a monitoring listener serves those (``migratory.server.monitor``)."""

from __future__ import annotations

from migratory.entitlement import ClientIdentity
from migratory.model.subject import InvalidSubjectError, validate_subject
from migratory.protocol.http import Request, response
from migratory.server.context import ServerContext
from migratory.server.web_assets import CLIENT_ASSETS, serve_asset


def error(status: int, reason: str) -> bytes:
    return response(status, (reason + "\n").encode())


def route(ctx: ServerContext, request: Request, peer: str) -> bytes:
    if request.method not in ("GET", "HEAD"):
        return error(405, f"method {request.method} not allowed; use GET")
    if request.path == "/snapshot":
        return snapshot(ctx, request, peer)
    if request.path == "/healthz":
        return response(200, b"ok\n")
    if request.path == "/readyz":
        reason = ctx.readiness()
        return response(200, b"ready\n") if reason is None else error(503, reason)
    monitoring = None if ctx.monitor is None else ctx.monitor.route(
        request, monitoring_listener=False
    )
    if monitoring is not None:
        return monitoring
    asset = serve_asset(CLIENT_ASSETS, request.path)
    if asset is not None:
        return asset
    return error(404, f"no such path {request.path!r}; try /snapshot?subject=/a/b")


def snapshot(ctx: ServerContext, request: Request, peer: str) -> bytes:
    """``GET /snapshot?subject=X[&token=U]``: the snapshot's content (no fields, as the seed)."""
    subject = request.query.get("subject")
    if subject is None:
        return error(400, "missing query parameter 'subject'")
    try:
        validate_subject(subject)
    except InvalidSubjectError as exc:
        return error(400, str(exc))
    identity = ClientIdentity(name="http", token=request.query.get("token"), peer=peer)
    if not ctx.entitlement.allow_subscribe(identity, subject):
        ctx.stats.count(ctx.stats.entitlement_denials, "subscribe")
        return error(403, f"not entitled to subscribe to {subject!r}")
    message = ctx.hub.snapshot(subject)
    if message is None:
        return error(404, f"no snapshot for {subject!r}")
    headers = (
        ("X-Migratory-Subject", subject.encode().decode("latin-1")),
        ("X-Migratory-Epoch", str(message.epoch)),
        ("X-Migratory-Seq", str(message.seq)),
    )
    return response(200, message.content, content_type="application/octet-stream", headers=headers)
