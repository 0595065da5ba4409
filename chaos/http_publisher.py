"""HTTP publishers of the workload (kind ``http``): ``POST /publish`` on keep-alive
connections, as a backend service publishes with an HTTP client (docs/http.md).

Each is a raw-socket HTTP/1.1 client (trio TCP, h11 framing: :class:`PublishExchange`,
sans-I/O) with up to :data:`POOL` connections, one request in flight on each (HTTP/1.1
answers in order; a second connection is the client's way to have two in flight). The
arrivals are the same open-loop Poisson arrivals as every publisher's; an arrival while
all :data:`POOL` connections wait for an answer is recorded ``fail`` (not sent).

What is recorded, per the ``publishes`` table:
- a 200 answer ``PUBLISH_OK`` with its ``epoch`` and ``seq``: ``ok`` (the answer comes
  once a seed majority holds the message, exactly as a native ``PUBLISH_OK``);
- any other answer: ``fail`` with its status and reason (nothing published: 4xx; the
  publishing path refused or could not tell: 503);
- a connection that ends, or no answer in :data:`~chaos.workload.PUBLISH_TIMEOUT` s,
  after the request went out: ``info`` (outcome unknown: it may have been published);
- a connection that cannot be opened: ``fail`` (not sent), and the next publish goes to
  the next member (a load balancer taking the member out).

Connections go to the members' client ports behind their proxies, so client-link
faults (delay, blackhole, reset) hit them as they hit the other clients.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import h11
import trio

from chaos.plan import PublisherPlan
from chaos.schedule import member
from chaos.workload import PUBLISH_TIMEOUT, Workload

KIND = "http"
POOL = 32  # connections per publisher, one request in flight on each
CONNECT_TIMEOUT = 2.0  # s to open a connection
READ_SIZE = 65536
LINK_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError)


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer to one ``POST /publish``: the HTTP status and its JSON body (``{}`` when
    it is not JSON); ``reusable``: the connection may carry the next request."""

    status: int
    body: dict[str, Any]
    reusable: bool


class ConnectionEnded(Exception):
    """The connection ended before a whole answer came."""


class PublishExchange:
    """One keep-alive HTTP/1.1 connection's requests and answers, sans-I/O."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._http = h11.Connection(h11.CLIENT)
        self._status = 0
        self._body: list[bytes] = []

    def request(self, subject: str, content: bytes, fields: dict[str, str], retained: bool,
                guaranteed: bool) -> bytes:
        """The bytes of one ``POST /publish`` of this message."""
        body = json.dumps({
            "subject": subject, "content": content.decode(), "fields": fields,
            "retained": retained, "qos": "guaranteed" if guaranteed else "standard",
        }).encode()
        headers = [("Host", self.host), ("Content-Type", "application/json"),
                   ("Content-Length", str(len(body)))]
        data = self._http.send(h11.Request(method="POST", target="/publish", headers=headers))
        return (data or b"") + (self._http.send(h11.Data(body)) or b"") + (
            self._http.send(h11.EndOfMessage()) or b"")

    def receive_data(self, data: bytes) -> Answer | None:
        """Feed what was read (``b""``: the connection ended); the answer once it is whole.
        Raises :class:`ConnectionEnded` when none can come (cut, or not HTTP)."""
        self._http.receive_data(data)
        while True:
            try:
                event = self._http.next_event()
            except h11.RemoteProtocolError as exc:
                raise ConnectionEnded(f"no answer: {exc}") from None
            if event is h11.NEED_DATA:
                if data == b"":
                    raise ConnectionEnded("the connection ended before the answer")
                return None
            if isinstance(event, h11.Response):
                self._status, self._body = event.status_code, []
            elif isinstance(event, h11.Data):
                self._body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return self._answer()
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionEnded("the connection ended before the answer")

    def _answer(self) -> Answer:
        try:
            body = json.loads(b"".join(self._body))
        except ValueError:
            body = {}
        reusable = self._http.our_state is h11.DONE and self._http.their_state is h11.DONE
        if reusable:
            self._http.start_next_cycle()
        return Answer(self._status, body if isinstance(body, dict) else {}, reusable)


class HttpConnection:
    """A :class:`PublishExchange` on a trio TCP stream to one member."""

    def __init__(self, stream: trio.SocketStream, port: int, member_name: str) -> None:
        self.stream, self.member = stream, member_name
        self.exchange = PublishExchange(f"127.0.0.1:{port}")

    async def publish(self, arrival: tuple[Any, ...]) -> Answer:
        _msg_id, subject, content, fields, retained, guaranteed = arrival
        await self.stream.send_all(
            self.exchange.request(subject, content, fields, retained, guaranteed))
        for _ in range(1_000_000):  # bounded for the linter; an answer is a few reads
            answer = self.exchange.receive_data(await self.stream.receive_some(READ_SIZE))
            if answer is not None:
                return answer
        raise ConnectionEnded("no end to the answer")


def outcome(answer: Answer) -> tuple[str, dict[str, Any]]:
    """The ``publishes`` row an answer makes: ``("ok", {epoch, seq})`` or ``("fail",
    {reason})``."""
    body = answer.body
    epoch, seq = body.get("epoch"), body.get("seq")
    if (answer.status == 200 and body.get("status") == "PUBLISH_OK"
            and isinstance(epoch, int) and isinstance(seq, int)):
        return "ok", {"epoch": epoch, "seq": seq}
    status = body.get("status") or "no status"
    return "fail", {"reason": f"HTTP {answer.status} {status}: {body.get('reason', '')}"[:200]}


class HttpPublisher:
    def __init__(self, w: Workload, spec: PublisherPlan, ports: list[int]) -> None:
        self.w, self.spec, self.ports = w, spec, ports
        self.arrivals = w.arrivals(spec)
        self.idx = spec.prefer  # the member a new connection goes to
        self.idle: list[HttpConnection] = []
        self.busy = 0

    async def run(self) -> None:
        w, name = self.w, self.spec.name
        async with trio.open_nursery() as nursery:
            while w.publishing:
                await trio.sleep_until(self.arrivals.due(trio.current_time()))
                arrival = self.arrivals.next()
                msg_id, subject, guaranteed = arrival[0], arrival[1], arrival[5]
                target = self.idle[-1].member if self.idle else member(self.idx)
                w.record_publish(name, "invoke", msg_id, subject, target,
                                 qos="guaranteed" if guaranteed else "standard")
                if self.busy >= POOL:
                    w.record_publish(name, "fail", msg_id, subject, target,
                                     reason=f"not sent: {POOL} requests in flight")
                    continue
                self.busy += 1
                nursery.start_soon(self._publish, arrival, target)
            with trio.move_on_after(PUBLISH_TIMEOUT + 1):
                while self.busy:
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
        for conn in self.idle:
            await conn.stream.aclose()

    async def _open(self) -> HttpConnection | None:
        idx = self.idx
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                stream = await trio.open_tcp_stream("127.0.0.1", self.ports[idx])
        except (OSError, trio.TooSlowError):
            if self.idx == idx:
                self.idx = (idx + 1) % len(self.ports)
            return None
        return HttpConnection(stream, self.ports[idx], member(idx))

    async def _publish(self, arrival: tuple[Any, ...], target: str) -> None:
        w, name = self.w, self.spec.name
        msg_id, subject = arrival[0], arrival[1]
        invoked = w.h.now()
        conn: HttpConnection | None = None
        try:
            conn = self.idle.pop() if self.idle else await self._open()
            if conn is None:
                w.record_publish(name, "fail", msg_id, subject, target,
                                 reason=f"not sent: no connection to {target}")
                return
            try:
                with trio.fail_after(PUBLISH_TIMEOUT):
                    answer = await conn.publish(arrival)
            except (*LINK_ERRORS, ConnectionEnded, trio.TooSlowError) as exc:
                reason = f"no answer in {PUBLISH_TIMEOUT} s" if isinstance(
                    exc, trio.TooSlowError) else f"connection lost: {type(exc).__name__}: {exc}"
                w.record_publish(name, "info", msg_id, subject, conn.member,
                                 reason=reason[:200])
                await _close(conn)
                if member(self.idx) == conn.member:
                    self.idx = (self.idx + 1) % len(self.ports)
                conn = None
                return
            event, result = outcome(answer)
            w.record_publish(name, event, msg_id, subject, conn.member,
                             invoked if event == "ok" else None, **result)
            if answer.reusable:
                self.idle.append(conn)
            else:
                await _close(conn)
            conn = None
        except trio.Cancelled:
            w.record_publish(name, "info", msg_id, subject, target,
                             reason="no answer before the run ended")
            raise
        finally:
            self.busy -= 1
            if conn is not None:
                with trio.CancelScope(shield=True):
                    await _close(conn)


async def _close(conn: HttpConnection) -> None:
    with trio.move_on_after(1):
        await conn.stream.aclose()


async def http_publisher(w: Workload, spec: PublisherPlan, ports: list[int]) -> None:
    """``ports[i]``: member i's client port (as the clients reach it)."""
    await HttpPublisher(w, spec, ports).run()
