"""A client that lost a right resumes nothing of that subject, on each front end of a
live server (Entitlement = Token): the native resubscribe with a position gets
SUBSCRIBE_DENY and no recovered message; an SSE stream reconnecting with Last-Event-ID
gets a ``deny`` event and nothing of the subject. The same token with the right gets
them (the resume would have delivered)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jwt
from httpclient import SseClient
from rawclient import RawClient, delivered

from migratory.model.message import Message
from migratory.protocol import ops

SECRET = "k" * 40


def token(subscribe: list[str], publish: list[str] | None = None) -> str:
    claims = {"exp": int(time.time()) + 600, "subscribe": subscribe, "publish": publish or []}
    return jwt.encode(claims, SECRET, algorithm="HS256")


def test_a_client_that_lost_a_right_resumes_nothing_of_it(start_server: Any,
                                                          tmp_path: Path) -> None:
    key = tmp_path / "secret"
    key.write_text(SECRET)
    server = start_server(BatchTime="0", Entitlement="Token",
                          EntitlementTokenKeyFile=str(key))
    publisher = RawClient(server.port)
    publisher.connect("publisher", token=token([], ["/Secret/**"]))
    statuses = [publisher.publish(Message("/Secret/a", b"%d" % i, closure=str(i)))
                for i in range(3)]
    since = statuses[0].position
    assert since is not None
    outcomes = {}
    for name, rights in (("lost", ["/Public/**"]), ("kept", ["/Secret/**"])):
        client = RawClient(server.port)
        client.connect(name, token=token(rights))
        client.subscribe("/Secret/a", position=since)
        until = ops.Status.SUBSCRIBE_DENY if name == "lost" else ops.Status.DATA_SYNC
        answer = client.recv_ops_until_status(until)
        outcomes[name] = [m.content for m in delivered(answer)]
        client.close()
    assert outcomes == {"lost": [], "kept": [b"1", b"2"]}
    last_event_id = f"{since.epoch}:{since.seq}"  # as sse.event_id writes it
    for name, rights in (("lost", ["/Public/**"]), ("kept", ["/Secret/**"])):
        stream = SseClient(server.port, ["/Secret/a"], last_event_id=last_event_id,
                           extra=f"&token={token(rights)}")
        kinds = []
        while (event := stream.next_event(timeout=5)) is not None:
            kinds.append((event["event"], event["data"].get("content")))
            if event["event"] in ("deny", "sync"):
                break
        stream.sock.close()
        outcomes[name] = kinds
    assert [kind for kind, _ in outcomes["lost"]] == ["deny"]
    assert outcomes["kept"] == [("subscribe", None), ("message", "1"), ("message", "2"),
                                ("sync", None)]
    publisher.close()
