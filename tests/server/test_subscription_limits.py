"""MaxSubscriptions counts every client's subscriptions, whatever its protocol (admission
.total_subscriptions_limit): native subjects, MQTT topic filters, SSE stream subjects.
It counted native ones only: MQTT sessions (1,000 filters each) and SSE streams (100
subjects each) subscribed past it without a trace. Refusals are counted by the limit's
name (``subscriptions_refused``; migratory_subscriptions_refused_total{limit})."""

from __future__ import annotations

from test_admission import frame, history_subscribe, written
from test_http_front import NullLink
from test_mqtt_session import HeldPublishing, make, read, session

from migratory.protocol import mqtt, ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import handshake_request, new_websocket_key
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.context import ServerContext
from migratory.server.mqtt_session import MqttSession
from migratory.server.session import Session


def subscribe_filters(device: MqttSession, names: list[str], packet_id: int = 1,
                      held: HeldPublishing | None = None) -> tuple[int, ...]:
    """The SUBACK's return codes (a persistent session's once its record is saved)."""
    device.receive_data(encode_packet(mqtt.Subscribe(packet_id, tuple((n, 0) for n in names))),
                        0.0)
    while held is not None and held.held:  # the save in flight, then the one carrying
        held.settle()  # the SUBSCRIBE (its SUBACK waits for that one: mqtt_saving)
    (suback,) = [p for p in read(device) if isinstance(p, mqtt.Suback)]
    return suback.return_codes


def native(ctx: ServerContext, name: str) -> Session:
    client = Session(ctx, NullLink(), "127.0.0.1:3")
    key = new_websocket_key()
    connect = ws.encode_masked_binary(ops.encode_client_op(ops.Connect(name)), b"mask")
    client.receive_data(handshake_request("127.0.0.1", "/", key) + connect, 0.0)
    written(client, key)
    return client


def sse(ctx: ServerContext, subjects: list[str]) -> tuple[Session, bytes]:
    stream = Session(ctx, NullLink(), "127.0.0.1:4")
    query = "&".join(f"subject={s}" for s in subjects)
    stream.receive_data(f"GET /events?{query} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), 0.0)
    return stream, stream.outbox.take()


def test_mqtt_filters_count_in_max_subscriptions() -> None:
    """Three MQTT sessions of 20 filters each under MaxSubscriptions = 50: the third
    gets 10 (0x80 for the rest, counted by limit); a session that leaves gives its room
    back."""
    ctx, _ = make(MaxSubscriptions="50")
    devices = [session(ctx, f"d{k}", {}) for k in range(3)]
    for device in devices:
        read(device)
    codes = [subscribe_filters(d, [f"a/{k}/{i}" for i in range(20)])
             for k, d in enumerate(devices)]
    assert codes[0] == codes[1] == (0,) * 20
    assert codes[2] == (0,) * 10 + (mqtt.SUBACK_FAILURE,) * 10
    assert ctx.stats.subscriptions_open == 50
    assert ctx.stats.subscriptions_refused == {"MaxSubscriptions": 10}
    devices[0].connection_lost()
    assert ctx.stats.subscriptions_open == 30
    assert subscribe_filters(devices[2], ["b/#"], 2) == (0,)


def test_many_clients_each_just_under_their_own_limit_meet_the_server_s() -> None:
    """Five clients of each kind, each one under MaxSubscriptionsPerConnection (4), the
    fifteen of them at MaxSubscriptions (45) between them: every one is granted; then
    one more of any kind is refused, naming MaxSubscriptions -- MQTT 0x80, native
    SUBSCRIBE_DENY, an SSE stream 503 before it subscribes to anything."""
    ctx, _ = make(MaxSubscriptions="45", MaxSubscriptionsPerConnection="4")
    devices = [session(ctx, f"d{k}", {}) for k in range(5)]
    for k, device in enumerate(devices):
        read(device)
        assert subscribe_filters(device, [f"m/{k}/{i}" for i in range(3)]) == (0,) * 3
    clients = [native(ctx, f"n{k}") for k in range(5)]
    for client in clients:
        client.receive_data(frame(history_subscribe(3, 0)), 0.0)
        assert not [op for op in written(client) if isinstance(op, ops.SubjectStatus)
                    and op.status is ops.Status.SUBSCRIBE_DENY]
    streams = [sse(ctx, [f"/s/{k}/{i}" for i in range(3)]) for k in range(5)]
    assert all(head.startswith(b"HTTP/1.1 200 ") for _, head in streams)
    assert ctx.stats.subscriptions_open == 45
    assert subscribe_filters(devices[0], ["m/0/more"], 2) == (mqtt.SUBACK_FAILURE,)
    clients[0].receive_data(frame(ops.Subscribe((ops.SubscriptionRequest("/more/n"),))), 0.0)
    (denied,) = written(clients[0])
    assert isinstance(denied, ops.SubjectStatus)
    assert denied.reason == "MaxSubscriptions (45) reached"
    _, head = sse(ctx, ["/more/s"])
    assert head.startswith(b"HTTP/1.1 503 ") and b"MaxSubscriptions (45) reached" in head
    assert ctx.stats.subscriptions_refused == {"MaxSubscriptions": 3}
    assert devices[0].subscriptions.add("m/0/x", 0, devices[0].identity, 0.0) == 0x80  # type: ignore[arg-type]
    for stream, _ in streams:
        stream.connection_lost()
        stream.connection_lost()  # idempotent: counted once
    for client in clients:
        client.connection_lost()
    for device in devices:
        device.connection_lost()
    assert ctx.stats.subscriptions_open == 0


def test_a_resumed_session_keeps_its_filters_past_the_server_s_limit() -> None:
    """The limit is reached while a persistent session is away; its resume takes its
    filters back all the same (a device's subscriptions are not dropped by a reconnect)
    and they count: the next SUBSCRIBE, of anyone, is refused until there is room."""
    ctx, held = make(MaxSubscriptions="10")
    registry: dict = {}
    device = session(ctx, "dev", registry, clean_session=False)
    read(device)
    device.receive_data(encode_packet(mqtt.Subscribe(1, tuple((f"k/{i}", 0) for i in range(6)))),
                        0.0)
    held.settle()
    device.connection_lost()
    held.settle()
    assert ctx.stats.subscriptions_open == 0
    other = session(ctx, "other", {})
    read(other)
    assert subscribe_filters(other, [f"o/{i}" for i in range(10)]) == (0,) * 10
    back = session(ctx, "dev", registry, clean_session=False)
    while back.subscriptions.busy:
        back.subscriptions.work(10_000)
    assert ctx.stats.subscriptions_open == 16
    assert sorted(back.subscriptions.filters()) == [f"k/{i}" for i in range(6)]
    read(back)
    assert subscribe_filters(back, ["k/new"], 2, held) == (mqtt.SUBACK_FAILURE,)
    other.connection_lost()
    assert subscribe_filters(back, ["k/new"], 3, held) == (0,)
