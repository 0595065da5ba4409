"""The HTTP phase of a client connection: requests on h11, keep-alive, CORS,
``POST /publish``, and the switch to a WebSocket or a Server-Sent Events stream.

The session feeds bytes in; responses go out through the session's outbox. A
publish waits for its outcome (in a cluster, the Raft commit) before the next
pipelined request is read: responses keep the requests' order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from migratory.entitlement_decisions import (
    ClientIdentity,
    DecisionPending,
    connect_refusal,
    deferred_decisions,
)
from migratory.listeners import Listener
from migratory.model.position import Position
from migratory.model.subject import InvalidSubjectError, reserved, validate_subject
from migratory.protocol import close_codes, ops, sse
from migratory.protocol.http import HttpError, Request, wants_mqtt
from migratory.protocol.http_api import (
    QUERY_PARAMETERS,
    parse_publish,
    publish_reply,
    query_problem,
)
from migratory.protocol.http_server import (
    ClientClosed,
    HttpServer,
    UpgradeRequested,
)
from migratory.server import http_routes
from migratory.server.admission import total_subscriptions_limit
from migratory.server.context import ServerContext, publish_ok_status
from migratory.server.http_routes import JSON, Reply, error
from migratory.server.publish_rules import check_publish

if TYPE_CHECKING:
    from migratory.model.outbox import Outbox

MAX_STREAM_SUBJECTS = 100
HTTP_CLOSURE = "http"  # the closure of an HTTP publish: its reply is this exchange
_CORS_METHODS = "GET, POST, OPTIONS"


class HttpSession(Protocol):
    """What the front asks of its session (:class:`migratory.server.session.Session`,
    which builds the front and passes itself)."""

    peer: str
    closing: bool  # write what is queued, then close
    aborted: bool  # close now, drop what is queued
    decision_pending: DecisionPending | None
    outbox: Outbox

    @property
    def in_http(self) -> bool: ...

    def cut_off(self, why: str) -> None: ...

    def reply_and_close(self, response: bytes) -> None: ...

    def send_unbounded(self, data: bytes) -> None: ...

    def flush(self) -> None: ...

    def start_websocket(self, request: Request, trailing: bytes, now: float) -> None: ...

    def start_stream(
        self,
        identity: ClientIdentity,
        subjects: list[str],
        requests: list[ops.SubscriptionRequest | str],
        headers: tuple[tuple[str, str], ...],
        now: float,
    ) -> None: ...

    def audit_client_as(self, identity: ClientIdentity | None) -> dict[str, Any]: ...


class HttpFront:
    __slots__ = ("_cors", "_ctx", "_held", "_http", "_listener", "_now", "_session",
                 "requests")

    def __init__(self, session: HttpSession, ctx: ServerContext, listener: Listener) -> None:
        self._session = session
        self._ctx = ctx
        self._listener = listener
        self._http = HttpServer(max_body=ctx.config.max_frame_size)
        self._now = 0.0
        self._cors: tuple[tuple[str, str], ...] = ()
        self.requests = 0  # requests answered: the connection's idle deadline restarts
        self._held: Request | None = None  # taken once the entitlement has decided it

    # --- input ----------------------------------------------------------------------

    @property
    def awaiting_answer(self) -> bool:
        """A request was handed out and has no answer yet (a publish waits for its
        outcome): the connection reads nothing more meanwhile."""
        return self._http.responding

    @property
    def buffered(self) -> int:
        """Bytes held for a request body not complete yet."""
        return self._http.buffered

    def receive(self, data: bytes, now: float) -> None:
        self._now = now
        self._http.receive_data(data)
        self._process()

    def resume(self, now: float) -> None:
        """The request held for an entitlement decision (Custom), then the rest."""
        held, self._held = self._held, None
        if held is None:
            return
        self._now = now
        if not self._decided_ahead(held):
            self._held = held
            return
        self._on_request(held)
        self._process()

    def _decided_ahead(self, request: Request) -> bool:
        """Ask the entitlement ahead of the request (Entitlement = Custom: the plugin's
        thread) without holding the event loop, with the identities the request is then
        answered with: False while a decision is pending (the session's
        ``decision_pending``; the connection waits, reads nothing more, and the request
        is answered after, from the decisions cached)."""
        entitlement = self._ctx.entitlement
        if entitlement.name != "Custom" or not self._listener.speaks("http"):
            return True
        peer, events = self._session.peer, request.path == "/events"
        if request.path in QUERY_PARAMETERS and query_problem(request.path, request.params):
            return True  # refused before the entitlement is asked
        try:
            with deferred_decisions(ahead=True):
                if request.path == "/publish" and request.method == "POST":
                    parsed = parse_publish(request.body, HTTP_CLOSURE)
                    identity = ClientIdentity(name="http", token=parsed.token, peer=peer)
                    if entitlement.allow_connect(identity) and _plain(parsed.message.subject):
                        entitlement.allow_publish(identity, parsed.message.subject)
                elif request.method == "GET" and (events or request.path == "/snapshot"):
                    name = request.query.get("client", "sse")[:200] if events else "http"
                    identity = ClientIdentity(name=name, token=request.query.get("token"),
                                              peer=peer)
                    subjects = (request.query_values("subject") if events
                                else [request.query.get("subject") or ""])
                    if (events and _stream_problem(subjects)) or not all(map(_plain, subjects)):
                        return True  # refused before the entitlement is asked
                    if entitlement.allow_connect(identity):
                        for subject in subjects:
                            entitlement.allow_subscribe(identity, subject)
        except DecisionPending as pending:
            self._session.decision_pending = pending
            return False
        except HttpError:
            pass  # answered as before, in _on_request
        return True

    def _process(self) -> None:
        session = self._session
        while session.in_http and not (session.closing or session.aborted):
            if session.outbox.pending_bytes > self._ctx.config.client_max_pending_bytes:
                # pipelined requests whose responses are not read: bound, then work
                session.cut_off("HTTP responses not read")
                return
            try:
                event = self._http.next_event()
            except HttpError as exc:
                stats = self._ctx.stats
                stats.protocol_errors += 1
                stats.count(stats.protocol_error_kinds, "http")
                session.reply_and_close(exc.encode())
                return
            early = self._http.data_to_send()  # 100 Continue
            if early:
                session.send_unbounded(early)
            if event is None:
                return
            if isinstance(event, ClientClosed):
                session.closing = True
                return
            if isinstance(event, UpgradeRequested):
                protocol = "mqtt" if wants_mqtt(event.request) else "native"
                if self._listener.speaks(protocol):
                    session.start_websocket(event.request, event.trailing, self._now)
                    return
                self._respond(error(404, f"this listener does not speak {protocol} "
                                    "over WebSocket (ListenerRoles)"))
                continue  # the connection stays HTTP: requests sent after it are answered
            if not self._decided_ahead(event.request):
                self._held = event.request
                return
            self._on_request(event.request)

    def _on_request(self, request: Request) -> None:
        self._cors = self._cors_headers(request)
        api = self._listener.speaks("http")
        if request.method == "OPTIONS" and api:
            self._respond(self._preflight(request))
        elif request.path == "/publish" and api:
            self._publish(request)
        elif request.path == "/events" and api and request.method == "GET":
            self._events(request)
        else:
            upgrade_error = request.websocket_upgrade_error()
            if upgrade_error is not None:
                self._respond(error(upgrade_error.status, upgrade_error.reason,
                                    upgrade_error.headers))
            else:
                self._respond(http_routes.route(self._ctx, request, self._session.peer, api=api))

    # --- CORS ---------------------------------------------------------------------

    def _cors_headers(self, request: Request) -> tuple[tuple[str, str], ...]:
        origins = self._ctx.config.http_cors_origins
        origin = request.header("origin")
        if not origins or origin is None:
            return ()
        if origins == ("*",):
            return (("Access-Control-Allow-Origin", "*"),)
        if origin in origins:
            return (("Access-Control-Allow-Origin", origin), ("Vary", "Origin"))
        return ()

    def _preflight(self, request: Request) -> Reply:
        if not self._cors:
            return Reply(204, headers=(("Allow", _CORS_METHODS),))
        asked = request.header("access-control-request-headers")
        headers = (
            ("Access-Control-Allow-Methods", _CORS_METHODS),
            ("Access-Control-Allow-Headers", asked or "Content-Type, Last-Event-ID"),
            ("Access-Control-Max-Age", "600"),
        )
        return Reply(204, headers=headers)

    # --- output ---------------------------------------------------------------------

    @staticmethod
    def refusal(code: int, reason: str) -> bytes:
        """The response of a connection the server closes in its HTTP phase: 503 for
        1013 TRY_AGAIN_LATER (a body over IncompleteFrameBudget), else 500."""
        status = 503 if code == close_codes.TRY_AGAIN_LATER.code else 500
        return HttpError(status, reason).encode()

    def _respond(self, reply: Reply) -> None:
        session = self._session
        if reply.raw:
            self.requests += 1
            session.reply_and_close(reply.raw)
            return
        data = self._http.respond(
            reply.status, reply.body, content_type=reply.content_type,
            headers=reply.headers + self._cors,
        )
        self.requests += 1
        session.send_unbounded(data)
        if self._http.must_close:
            session.closing = True
        session.flush()

    # --- POST /publish ----------------------------------------------------------------

    def _publish(self, request: Request) -> None:
        if request.method != "POST":
            self._respond(error(405, "use POST with a JSON body", (("Allow", "POST"),)))
            return
        problem = query_problem("/publish", request.params)
        if problem is not None:
            self._respond(error(400, problem))
            return
        try:
            parsed = parse_publish(request.body, HTTP_CLOSURE)
        except HttpError as exc:
            self._respond(error(exc.status, exc.reason))
            return
        ctx, message = self._ctx, parsed.message
        identity = ClientIdentity(name="http", token=parsed.token, peer=self._session.peer)
        ctx.stats.publishes_received += 1
        connects = ctx.entitlement.allow_connect(identity)  # each request, as /events
        if connects:
            status, reason = check_publish(ctx, self._listener, identity, message)
        else:
            status, reason = ops.Status.PUBLISH_DENIED, "entitlement refused the connection"
        unavailable = status is None and ctx.readiness() is not None
        if unavailable:  # a member not ready (syncing, no seed): 503, try again or elsewhere
            status, reason = ops.Status.PUBLISH_FAILED, ctx.readiness()
        audit = ctx.audit
        if audit is not None and audit.message:
            audit.event("message", "publish", self._session.audit_client_as(identity),
                        subject=message.subject, size=message.size(),
                        retained=message.retained, closure=None,
                        outcome="submitted" if status is None else status.name, reason=reason)
        if status is ops.Status.PUBLISH_DENIED:
            ctx.stats.count(ctx.stats.entitlement_denials, "publish" if connects else "connect")
        if status is not None:
            ctx.stats.publishes_refused += 1
            refused = ops.PublishStatus(status, HTTP_CLOSURE, message.subject, None, reason)
            code, body = publish_reply(refused, refused=not unavailable)
            self._respond(Reply(code, body, JSON))
            return
        ctx.publishing.submit(message, self, self._now)  # answered in publish_result

    def publish_result(self, status: ops.PublishStatus) -> None:
        """The outcome of the pending publish (PublishReply): answer, then read on."""
        session = self._session
        if session.closing or session.aborted or not self._http.responding:
            return
        code, body = publish_reply(status)
        self._respond(Reply(code, body, JSON))
        self._process()  # requests that arrived meanwhile

    def publish_ok(self, closure: str | None, subject: str, epoch: int, seq: int) -> None:
        self.publish_result(publish_ok_status(closure, subject, epoch, seq))

    def flush(self) -> None:
        self._session.flush()

    # --- GET /events ------------------------------------------------------------------

    def _events(self, request: Request) -> None:
        subjects = request.query_values("subject")
        problem = query_problem("/events", request.params) or _stream_problem(subjects)
        if problem is not None:
            self._respond(error(400, problem))
            return
        refusal = next(filter(None, map(reserved, subjects)), None)
        if refusal is not None:  # 403, as GET /snapshot of the subject
            self._respond(error(403, refusal))
            return
        not_ready = self._ctx.readiness()
        if not_ready is not None:
            self._respond(error(503, not_ready, (("Retry-After", "1"),)))
            return
        name = request.query.get("client", "sse")[:200]
        identity = ClientIdentity(name=name, token=request.query.get("token"),
                                  peer=self._session.peer)
        entitlement, stats, audit = self._ctx.entitlement, self._ctx.stats, self._ctx.audit
        if not entitlement.allow_connect(identity):
            stats.count(stats.entitlement_denials, "connect")
            if audit is not None and audit.access:
                audit.event("access", "connect", self._session.audit_client_as(identity),
                            outcome="denied")
            # 403 whatever the cause (EventSource ends at any status but 200); the reason
            # says which: expired, not valid yet (nbf), or refused
            self._respond(error(403, connect_refusal(entitlement, identity)[1]))
            return
        over = total_subscriptions_limit(self._ctx, len(subjects))  # bound, then work
        if over is not None:
            self._respond(error(503, over, (("Retry-After", "5"),)))
            return
        last = request.header("last-event-id") or request.query.get("lastEventId")
        positions: list[Position | None] = [None] * len(subjects)
        if last is not None:
            parsed = sse.parse_event_id(last, len(subjects))
            # an id we cannot read: every subject resyncs (snapshot + resync), never a gap
            positions = parsed if parsed is not None else [Position(0, 0)] * len(subjects)
        requests: list[ops.SubscriptionRequest | str] = [
            ops.SubscriptionRequest(subject, position)
            if entitlement.allow_subscribe(identity, subject) else "not entitled to subscribe"
            for subject, position in zip(subjects, positions, strict=True)
        ]
        if audit is not None and audit.access:
            audit.event("access", "connect", self._session.audit_client_as(identity),
                        outcome="allowed")
        for subject, allowed in zip(subjects, requests, strict=True):
            if isinstance(allowed, str):
                stats.count(stats.entitlement_denials, "subscribe")
            if audit is not None and audit.access:
                audit.event("access", "subscribe", self._session.audit_client_as(identity),
                            subject=subject, outcome="denied" if isinstance(allowed, str)
                            else "allowed")
        self.requests += 1
        self._session.start_stream(identity, subjects, requests, self._cors, self._now)


def _plain(subject: str) -> bool:
    """A valid subject, not reserved: what the entitlement is asked about."""
    try:
        validate_subject(subject)
    except InvalidSubjectError:
        return False
    return reserved(subject) is None


def _stream_problem(subjects: list[str]) -> str | None:
    if not subjects:
        return "give one or more subjects: /events?subject=/a/b&subject=/c/d"
    if len(subjects) > MAX_STREAM_SUBJECTS:
        return f"at most {MAX_STREAM_SUBJECTS} subjects per stream"
    if len(set(subjects)) != len(subjects):
        return "a subject is given twice"
    for subject in subjects:
        try:
            validate_subject(subject)
        except InvalidSubjectError as exc:
            return str(exc)
    return None
