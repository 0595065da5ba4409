"""Bound, then work: what a session refuses before it does what a client asks
(migratory/server/admission.py, session.py), without sockets."""

from __future__ import annotations

import gc
from dataclasses import dataclass

import pytest

from migratory.config import Config
from migratory.entitlement import entitlement_from_config
from migratory.model import cache as cache_module
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import close_codes, ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import check_handshake_response, handshake_request, new_websocket_key
from migratory.server.admission import SUBSCRIBE_TOO_LARGE, PublishRate, address_allowed
from migratory.server.app import build_hub
from migratory.server.context import LocalPublishing, ServerContext, ServerStatistics
from migratory.server.session import Session
from migratory.server.session_subscriptions import SLICE_UNITS


@dataclass
class Wire:
    writing: bool = False

    def mark_dirty(self) -> None:
        pass

    def flush_now(self) -> None:
        pass


def new_session(**settings: str) -> tuple[Session, ServerContext, str]:
    config = Config.from_mapping(settings)
    hub = build_hub(config)
    ctx = ServerContext(
        config, hub, entitlement_from_config(config), ServerStatistics(), LocalPublishing(hub)
    )
    session = Session(ctx, Wire(), "127.0.0.1:1")
    key = new_websocket_key()
    connect = ws.encode_masked_binary(ops.encode_client_op(ops.Connect("c")), b"mask")
    session.receive_data(handshake_request("127.0.0.1", "/", key) + connect, 0.0)
    return session, ctx, key


def frame(op: ops.ClientOp) -> bytes:
    return ws.encode_masked_binary(ops.encode_client_op(op), b"mask")


def written(session: Session, key: str | None = None) -> list[ops.ServerOp | ws.Event]:
    data = session.outbox.take()
    if key is not None:
        used = check_handshake_response(data, key)
        assert used is not None
        data = data[used:]
    out: list[ops.ServerOp | ws.Event] = []
    for event in ws.FrameDecoder(client_frames=False, max_message_size=1 << 26).events(data):
        binary = isinstance(event, ws.BinaryMessage)
        out.append(ops.decode_server_op(event.data) if binary else event)  # type: ignore[union-attr]
    return out


def fill(ctx: ServerContext, subject: str, count: int, size: int) -> None:
    for i in range(count):
        ctx.hub.publish(Message(subject, bytes([i % 256]) * size), 0.0)


def history_subscribe(count: int, history: int) -> ops.Subscribe:
    return ops.Subscribe(
        tuple(ops.SubscriptionRequest(f"/Big/S{i}", history=history) for i in range(count))
    )


def test_a_subscribe_whose_answer_would_not_fit_is_refused_before_anything_is_encoded() -> None:
    session, ctx, key = new_session(ClientMaxPendingBytes="1048576")
    for i in range(20):
        fill(ctx, f"/Big/S{i}", 100, 1000)  # 100 kB of history each
    written(session, key)
    session.receive_data(frame(history_subscribe(20, 1000)), 1.0)  # 2 MB of answer
    answer = written(session)
    assert [type(op) for op in answer] == [ops.SubjectStatus] * 20
    for i, op in enumerate(answer):
        assert isinstance(op, ops.SubjectStatus)
        assert (op.status, op.subject) == (ops.Status.SUBSCRIBE_DENY, f"/Big/S{i}")
        assert op.reason is not None and op.reason.startswith(SUBSCRIBE_TOO_LARGE)
    assert not session.subjects and not session.closing
    assert ctx.stats.subscribes_refused == 1
    # the same with fewer subjects fits: answered in full
    session.receive_data(frame(history_subscribe(5, 1000)), 2.0)
    answer = written(session)
    delivered = [m for op in answer if isinstance(op, ops.Deliver) for m in op.messages]
    assert len(delivered) == 500 and len(session.subjects) == 5


def test_the_answer_bound_is_never_below_what_is_written() -> None:
    session, ctx, key = new_session()
    fill(ctx, "/A/b", 50, 333)
    ctx.hub.publish(Message("/A/c", b"x" * 999, {"f": "v" * 50}, retained=True), 0.0)
    many_fields = {str(i): "" for i in range(300)}  # CBOR headers outweigh the text
    ctx.hub.publish(Message("/A/d", b"", many_fields, retained=True), 0.0)
    for i in range(20):
        ctx.hub.publish(Message("/A/e", b"", {str(j): "x" * 300 for j in range(i)}), 0.0)
    written(session, key)
    epoch = ctx.hub.epoch
    requests = (
        ops.SubscriptionRequest("/A/b", history=7),
        ops.SubscriptionRequest("/A/b", history=5000),
        ops.SubscriptionRequest("/A/c"),
        ops.SubscriptionRequest("/A/b", position=Position(epoch, 10)),
        ops.SubscriptionRequest("/A/b", position=Position(epoch + 1, 3)),
        ops.SubscriptionRequest("/A/c", position=Position(epoch + 1, 3)),
        ops.SubscriptionRequest("/A/d"),
        ops.SubscriptionRequest("/A/e", history=20),
        ops.SubscriptionRequest("/A/e", history=3),
        ops.SubscriptionRequest("/A/none", history=10),
    )
    answered = 0
    for request in requests:
        bound = ctx.hub.answer_bytes(request)
        session.receive_data(frame(ops.Subscribe((request,))), 1.0)
        data = session.outbox.take()
        decoder = ws.FrameDecoder(client_frames=False, max_message_size=1 << 26)
        delivered = [
            e.data for e in decoder.events(data)
            if isinstance(e, ws.BinaryMessage)
            and isinstance(ops.decode_server_op(e.data), ops.Deliver)
        ]
        assert sum(len(ws.encode_binary(d)) for d in delivered) <= bound, request
        answered += bool(delivered)
    assert answered == 8  # the bound was checked against real answers


def test_processing_is_bounded_per_call_and_resumes_in_order() -> None:
    session, _ctx, key = new_session()
    written(session, key)
    pings = b"".join(frame(ops.Ping(i)) for i in range(200))
    assert session.receive_data(pings, 1.0, budget=64) is True
    first = written(session)
    assert [op.id for op in first if isinstance(op, ops.Pong)] == list(range(64))
    while session.process(1.0, 64):
        pass
    rest = written(session)
    assert [op.id for op in rest if isinstance(op, ops.Pong)] == list(range(64, 200))


def test_a_large_subscribe_is_answered_over_several_turns() -> None:
    session, _ctx, key = new_session()
    written(session, key)
    many = ops.Subscribe(tuple(ops.SubscriptionRequest(f"/T/s{i}") for i in range(500)))
    assert session.receive_data(frame(many), 1.0, budget=64) is True
    # the subscribe operation counted one; no answer starts that could pass the 64
    assert len(session.subjects) == 64 - SLICE_UNITS
    turns = 1
    while session.process(1.0, 64):
        turns += 1
    assert len(session.subjects) == 500 and turns >= 7


def test_too_many_entries_close_with_4000() -> None:
    session, _ctx, key = new_session(MaxSubjectsPerSubscribe="10")
    written(session, key)
    session.receive_data(frame(history_subscribe(11, 0)), 1.0)
    assert session.close_code == close_codes.BAD_OPERATION.code


def test_subscriptions_per_connection_are_capped() -> None:
    session, _ctx, key = new_session(MaxSubscriptionsPerConnection="3")
    written(session, key)
    session.receive_data(frame(history_subscribe(5, 0)), 1.0)
    denied = [
        op.subject for op in written(session)
        if isinstance(op, ops.SubjectStatus) and op.status is ops.Status.SUBSCRIBE_DENY
    ]
    assert denied == ["/Big/S3", "/Big/S4"] and len(session.subjects) == 3


def test_a_publish_that_would_grow_the_merged_snapshot_past_the_limit_is_refused() -> None:
    session, ctx, key = new_session(MaxMessageSize="2000")
    written(session, key)
    statuses = []
    for i in range(10):
        message = Message("/Snap/s", b"v", {f"field{i}": "x" * 300}, retained=True, closure=str(i))
        session.receive_data(frame(ops.Publish(message)), 1.0)
        statuses += [op for op in written(session) if isinstance(op, ops.PublishStatus)]
    kinds = [s.status for s in statuses]
    assert kinds[:6] == [ops.Status.PUBLISH_OK] * 6
    assert kinds[6:] == [ops.Status.MESSAGE_SIZE_LIMIT_EXCEEDED] * 4
    snapshot = ctx.hub.snapshot("/Snap/s")
    assert snapshot is not None and snapshot.size() <= 2000
    # replacing a field's value does not grow it: still taken
    message = Message("/Snap/s", b"v", {"field0": "y" * 300}, retained=True, closure="r")
    session.receive_data(frame(ops.Publish(message)), 1.0)
    [status] = [op for op in written(session) if isinstance(op, ops.PublishStatus)]
    assert status.status is ops.Status.PUBLISH_OK


def test_publish_rate_and_address_list() -> None:
    rate = PublishRate(10, now=0.0)
    assert sum(rate.take(0.0) for _ in range(20)) == 10
    assert rate.take(0.05) is False and rate.take(0.11) is True
    assert PublishRate(0, now=0.0).take(0.0)
    session, _ctx, key = new_session(MaxPublishesPerSecond="5")
    written(session, key)
    for i in range(8):
        session.receive_data(frame(ops.Publish(Message("/R/s", b"x", closure=str(i)))), 1.0)
    kinds = [op.status for op in written(session) if isinstance(op, ops.PublishStatus)]
    assert kinds == [ops.Status.PUBLISH_OK] * 5 + [ops.Status.PUBLISH_FAILED] * 3
    config = Config.from_mapping({"PublishAllowFromAddressList": "10.0.0.0/8, ::1"})
    networks = config.publish_allow_from_address_list
    assert address_allowed(networks, "10.1.2.3:5") and address_allowed(networks, "[::1]:5")
    assert not address_allowed(networks, "127.0.0.1:5") and address_allowed((), "1.2.3.4:1")
    session, _ctx, key = new_session(PublishAllowFromAddressList="10.0.0.0/8")
    written(session, key)
    session.receive_data(frame(ops.Publish(Message("/R/s", b"x", closure="a"))), 1.0)
    [status] = [op for op in written(session) if isinstance(op, ops.PublishStatus)]
    assert status.status is ops.Status.PUBLISH_DENIED


def test_a_session_that_never_publishes_holds_no_publish_rate() -> None:
    # issue 13 (10,000 idle connections at most 6 KiB each): most clients only subscribe,
    # and the token bucket of each was ~80 bytes (tracemalloc on a served connection)
    session, _ctx, key = new_session(MaxPublishesPerSecond="5")
    written(session, key)
    session.receive_data(frame(ops.Subscribe((ops.SubscriptionRequest("/R/s"),))), 500.0)
    assert not any(isinstance(held, PublishRate) for held in gc.get_referents(session))
    # made at the first publish, with a whole second's burst as before
    for i in range(7):
        session.receive_data(frame(ops.Publish(Message("/R/s", b"x", closure=str(i)))), 900.0)
    kinds = [op.status for op in written(session) if isinstance(op, ops.PublishStatus)]
    assert kinds == [ops.Status.PUBLISH_OK] * 5 + [ops.Status.PUBLISH_FAILED] * 2
    assert any(isinstance(held, PublishRate) for held in gc.get_referents(session))


def test_head_gets_the_head_only() -> None:
    config = Config.defaults()
    hub = build_hub(config)
    ctx = ServerContext(
        config, hub, entitlement_from_config(config), ServerStatistics(), LocalPublishing(hub)
    )
    for method, has_body in (("HEAD", False), ("GET", True)):
        session = Session(ctx, Wire(), "127.0.0.1:1")
        session.receive_data(f"{method} /healthz HTTP/1.1\r\nHost: x\r\n\r\n".encode(), 0.0)
        reply = session.outbox.take()
        head, _, body = reply.partition(b"\r\n\r\n")
        assert b"content-length: 3" in head.lower() and (body == b"ok\n") is has_body


@pytest.mark.parametrize("count", [10_000])
def test_refusing_a_huge_subscribe_costs_little(
    count: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10,000 entries each asking for the 1,000 cached messages of /Big/S0: refused from
    the caches' sizes, without rebuilding one cached message (every read of a cache
    rebuilds its messages through ``cache._message``), and answered in a few bytes each."""
    session, ctx, key = new_session(MaxSubjectsPerSubscribe="10000")
    fill(ctx, "/Big/S0", 1000, 100)
    written(session, key)
    rebuilt = []
    real = cache_module._message
    monkeypatch.setattr(cache_module, "_message",
                        lambda *entry: rebuilt.append(1) or real(*entry))
    other = Session(ctx, Wire(), "127.0.0.1:2")  # the count sees a subscribe's history read
    other.receive_data(handshake_request("127.0.0.1", "/", new_websocket_key()), 0.0)
    other.receive_data(frame(ops.Connect("other")), 0.0)
    other.receive_data(frame(ops.Subscribe((ops.SubscriptionRequest("/Big/S0", history=3),))), 1.0)
    assert len(rebuilt) >= 3
    rebuilt.clear()
    op = ops.Subscribe((ops.SubscriptionRequest("/Big/S0", history=1000),) * count)
    session.receive_data(frame(op), 1.0)
    answer = written(session)
    assert len(answer) == count and session.outbox.pending_bytes == 0
    assert all(isinstance(op, ops.SubjectStatus) for op in answer)
    assert sum(len(ops.encode_server_op(op)) for op in answer) < 100 * count  # type: ignore[arg-type]
    assert rebuilt == [], f"{len(rebuilt)} cached messages rebuilt to refuse the subscribe"


def test_subscriptions_of_all_connections_are_capped() -> None:
    first, ctx, key = new_session(MaxSubscriptions="4")
    written(first, key)
    second = Session(ctx, Wire(), "127.0.0.1:2")
    second_key = new_websocket_key()
    connect = ws.encode_masked_binary(ops.encode_client_op(ops.Connect("c2")), b"mask")
    second.receive_data(handshake_request("127.0.0.1", "/", second_key) + connect, 0.0)
    written(second, second_key)
    first.receive_data(frame(history_subscribe(3, 0)), 1.0)
    second.receive_data(frame(history_subscribe(3, 0)), 1.0)  # room for one more
    denied = [
        op.reason for op in written(second)
        if isinstance(op, ops.SubjectStatus) and op.status is ops.Status.SUBSCRIBE_DENY
    ]
    assert denied == ["MaxSubscriptions (4) reached"] * 2
    assert ctx.stats.subscriptions_open == 4 and second.subjects == {"/Big/S0"}
    first.receive_data(frame(ops.Unsubscribe(("/Big/S0",))), 2.0)
    second.receive_data(frame(history_subscribe(3, 0)), 2.0)  # S0 again (held), S1 fits
    assert second.subjects == {"/Big/S0", "/Big/S1"} and ctx.stats.subscriptions_open == 4
    first.connection_lost()
    second.connection_lost()
    assert ctx.stats.subscriptions_open == 0


def test_a_resume_from_an_epoch_the_subject_no_longer_has_is_sized_as_its_snapshot() -> None:
    """Its answer is the snapshot and DATA_RESYNC; sized as the whole cache, it was
    refused ("subscribe answer too large") on a client whose pending limit the cache
    passes: the SDK then had to give the subject up (helper-38's report)."""
    session, ctx, key = new_session(ClientMaxPendingBytes="65536", MaxMessageSize="32768")
    fill(ctx, "/A/b", 400, 300)  # ~120 kB cached: more than the client may have pending
    ctx.hub.publish(Message("/A/b", b"s" * 100, retained=True), 0.0)
    written(session, key)
    stale = Position(ctx.hub.epoch + 1, 3)
    request = ops.SubscriptionRequest("/A/b", position=stale)
    assert ctx.hub.answer_bytes(request) < 1000
    session.receive_data(frame(ops.Subscribe((request,))), 1.0)
    answer = written(session)
    statuses = [op.status for op in answer if isinstance(op, ops.SubjectStatus)]
    assert statuses == [ops.Status.SUBSCRIBE_ALLOW, ops.Status.DATA_RESYNC], answer
    (snapshot,) = [m for op in answer if isinstance(op, ops.Deliver) for m in op.messages]
    assert snapshot.content == b"s" * 100
