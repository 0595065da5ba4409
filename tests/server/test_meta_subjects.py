"""Push monitoring: /migratory/stats/<member> is denied without the monitoring token,
delivered with it; nobody may publish a meta-subject."""

from __future__ import annotations

import json
from typing import Any

from rawclient import RawClient

from migratory.entitlement import NoEntitlement
from migratory.entitlement_decisions import ClientIdentity
from migratory.model.message import Message
from migratory.protocol import ops
from migratory.server.meta_subjects import (
    CLUSTER_SUBJECT,
    MetaSubjectEntitlement,
    meta_message,
    stats_subject,
)

TOKEN = "monitoring-s3cret"


def client(token: str | None) -> ClientIdentity:
    return ClientIdentity(name="c", token=token, peer="127.0.0.1:1")


def test_only_the_token_holder_subscribes_and_nobody_publishes_meta_subjects() -> None:
    entitlement = MetaSubjectEntitlement(NoEntitlement(), TOKEN)
    subject = stats_subject("m1")
    assert not entitlement.allow_subscribe(client(None), subject)
    assert not entitlement.allow_subscribe(client("wrong"), subject)
    assert entitlement.allow_subscribe(client(TOKEN), subject)
    assert entitlement.allow_subscribe(client(TOKEN), CLUSTER_SUBJECT)
    assert not entitlement.allow_publish(client(TOKEN), subject)
    assert entitlement.allow_subscribe(client(None), "/any/subject")  # the rest: inner rules
    assert entitlement.allow_publish(client(None), "/any/subject")


def test_the_token_holder_connects_under_token_entitlement_and_reads_meta_subjects_only(
) -> None:
    """The MonitorToken is no JWT: under Entitlement = Token the dashboard was refused at
    connect (4003) and push monitoring could not be read at all."""
    from migratory.entitlement_token import TokenEntitlement

    entitlement = MetaSubjectEntitlement(TokenEntitlement(algorithm="HS256", keys=b"s" * 40),
                                         TOKEN)
    assert entitlement.allow_connect(client(TOKEN))
    assert entitlement.allow_subscribe(client(TOKEN), CLUSTER_SUBJECT)
    assert entitlement.expiry(client(TOKEN)) is None  # never closed as expired
    assert not entitlement.allow_subscribe(client(TOKEN), "/any/subject")
    assert not entitlement.allow_publish(client(TOKEN), "/any/subject")
    assert not entitlement.allow_connect(client("wrong"))
    assert not MetaSubjectEntitlement(TokenEntitlement(algorithm="HS256", keys=b"s" * 40),
                                      "").allow_connect(client(""))


def test_without_a_token_nobody_reads_meta_subjects() -> None:
    entitlement = MetaSubjectEntitlement(NoEntitlement(), "")
    assert not entitlement.allow_subscribe(client(""), CLUSTER_SUBJECT)
    assert not entitlement.allow_subscribe(client(None), CLUSTER_SUBJECT)


def test_member_names_become_valid_subjects() -> None:
    assert stats_subject("migratory-0.migratory-members:9800") == (
        "/migratory/stats/migratory-0.migratory-members:9800"
    )
    assert stats_subject("a/b c") == "/migratory/stats/a_b_c"
    message = meta_message(CLUSTER_SUBJECT, "cluster", "m1", {"status": {"ready": True}})
    body = json.loads(message.content)
    assert body == {"format": 1, "kind": "cluster", "member": "m1", "status": {"ready": True}}
    assert message.retained and dict(message.fields) == {"kind": "cluster", "member": "m1"}


def test_stats_are_pushed_to_the_token_holder_only(start_server: Any) -> None:
    server = start_server(MonitorToken=TOKEN, MonitorPushInterval="1", ServerName="node-a")
    subject = stats_subject("node-a")
    outsider = RawClient(server.port)
    outsider.connect("outsider")
    outsider.subscribe(subject)
    deny = outsider.recv_op()
    assert isinstance(deny, ops.SubjectStatus) and deny.status is ops.Status.SUBSCRIBE_DENY
    forger = RawClient(server.port)
    forger.connect("forger", token=TOKEN)
    forged = forger.publish(Message(subject, b"{}", retained=True, closure="x"))
    assert forged.status is ops.Status.PUBLISH_DENIED
    dashboard = RawClient(server.port, timeout=10)
    dashboard.connect("dashboard", token=TOKEN)
    dashboard.subscribe(subject)
    received = []
    while len(received) < 2:  # the retained snapshot (if pushed already) and live ones
        op = dashboard.recv_op()
        if isinstance(op, ops.Deliver):
            received.extend(op.messages)
    bodies = [json.loads(m.content) for m in received]
    for body in bodies:
        assert body["format"] == 1 and body["kind"] == "stats" and body["member"] == "node-a"
        assert body["server"] == "node-a"
        assert body["counters"]["sessions_opened"] >= 3
        windows = body["windows"]["indicators"]
        assert set(windows) == {"clients", "messages_in_per_second",
                                "messages_out_per_second", "bytes_out_per_second",
                                "latency_ms"}
        assert set(windows["clients"]) == {"1m", "5m", "15m", "1h", "1d"}
    assert bodies[-1]["windows"]["indicators"]["clients"]["1m"]["samples"] >= 1
    assert bodies[-1]["time"] > bodies[0]["time"] or len(bodies) > 2
    # nothing reached the outsider: its subscription was denied
    outsider.sock.settimeout(0.5)
    try:
        op = outsider.recv_op(timeout=0.5)
    except TimeoutError:
        op = None
    assert op is None
