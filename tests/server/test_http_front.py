"""The HTTP phase of a client connection (migratory/server/http_front.py) without
sockets: bytes into a Session, responses out of its outbox."""

from __future__ import annotations

from migratory.config import load_config
from migratory.listeners import Listener
from migratory.protocol.http import handshake_request, new_websocket_key
from migratory.server.app import Server
from migratory.server.session import Session


class NullLink:
    writing = False

    def mark_dirty(self) -> None:
        pass

    def flush_now(self) -> None:
        pass


def test_a_request_pipelined_after_a_refused_upgrade_is_answered() -> None:
    """A WebSocket upgrade this listener's role refuses gets 404 and the connection
    stays HTTP: the request sent right behind it is answered at once, not when (if ever)
    more bytes arrive."""
    server = Server(load_config(overrides={"Listen": "127.0.0.1:0"}, environ={}))
    api_only = Listener(("127.0.0.1", 1), encrypted=False, protocols=frozenset({"http"}),
                        publish=True)
    session = Session(server.ctx, NullLink(), "127.0.0.1:5", api_only)
    upgrade = handshake_request("127.0.0.1:1", "/", new_websocket_key())
    session.receive_data(upgrade + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 0.0)
    answers = session.outbox.take()
    assert answers.startswith(b"HTTP/1.1 404 ") and b"ListenerRoles" in answers
    assert answers.count(b"HTTP/1.1 ") == 2 and answers.endswith(b"\r\n\r\nok\n")
    assert session.in_http and not session.closing


def _publish(session: Session, subject: str) -> bytes:
    body = b'{"subject": "%s", "content": "x"}' % subject.encode()
    session.receive_data(b"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body), 0.0)
    return session.outbox.take()


def test_a_publish_to_a_member_not_ready_is_503_and_a_bad_subject_400() -> None:
    """A member not ready (syncing, no seed yet) refuses a publish for a while: 503, the
    status that says 'try again, or another member' (docs/http.md). Before: 400, the
    client's fault, as for an invalid subject (the chaos run's HTTP publisher met it
    while a non-seed looked for its seed). An invalid subject stays 400."""
    server = Server(load_config(overrides={"Listen": "127.0.0.1:0"}, environ={}))
    listener = Listener(("127.0.0.1", 1), encrypted=False, protocols=frozenset({"http"}),
                        publish=True)
    server.ctx.readiness = lambda: "member is not replicating from a seed yet"
    session = Session(server.ctx, NullLink(), "127.0.0.1:5", listener)
    answer = _publish(session, "/a/b")
    assert answer.startswith(b"HTTP/1.1 503 "), answer
    assert b'"PUBLISH_FAILED"' in answer and b"not replicating from a seed yet" in answer
    answer = _publish(session, "/a//b")
    assert answer.startswith(b"HTTP/1.1 400 "), answer
