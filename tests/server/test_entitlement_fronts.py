"""Entitlement attacked through the front ends, without I/O: an MQTT persistent session
resumed with a token that lost its rights, MQTT wildcard filters wider than a token's
patterns or reaching the meta-subjects."""

from __future__ import annotations

import time
from typing import Any

import jwt
from test_mqtt_session import HeldPublishing, Wire, read

from migratory.config import Config
from migratory.entitlement_token import TokenEntitlement
from migratory.protocol import mqtt
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.app import build_hub
from migratory.server.context import ServerContext, ServerStatistics
from migratory.server.meta_subjects import MetaSubjectEntitlement
from migratory.server.mqtt_session import MqttSession

SECRET = b"s" * 40


def token(subscribe: list[str], publish: list[str] | None = None) -> str:
    claims = {"exp": int(time.time()) + 600, "subscribe": subscribe, "publish": publish or []}
    return jwt.encode(claims, SECRET, algorithm="HS256")


def make(entitlement: Any) -> tuple[ServerContext, HeldPublishing]:
    config = Config.from_mapping({})
    hub = build_hub(config)
    held = HeldPublishing(hub)
    ctx = ServerContext(config, hub, MetaSubjectEntitlement(entitlement, ""),
                        ServerStatistics(), held)
    return ctx, held


def connect(ctx: ServerContext, client_id: str, registry: dict, password: str,
            **options: Any) -> MqttSession:
    s = MqttSession(ctx, Wire(), "127.0.0.1:1", registry)
    packet = mqtt.Connect(client_id, username="u", password=password.encode(), **options)
    s.receive_data(encode_packet(packet), 0.0)
    return s


def published(s: MqttSession) -> list[tuple[str, bytes]]:
    return [(p.topic, p.payload) for p in read(s) if isinstance(p, mqtt.Publish)]


def test_a_persistent_session_resumed_with_a_token_that_lost_a_right_drops_that_filter() -> None:
    ctx, held = make(TokenEntitlement(algorithm="HS256", keys=SECRET))
    registry: dict = {}
    device = connect(ctx, "dev", registry, token(["/Secret/**", "/Public/**"]),
                     clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("Secret/#", 1), ("Public/a", 1)))),
                        0.0)
    held.settle()
    assert read(device)[-1] == mqtt.Suback(1, (1, 1))
    device.connection_lost()
    held.settle()
    publisher = connect(ctx, "pub", registry, token([], ["/Secret/**", "/Public/**"]))
    for topic in ("Secret/plans", "Public/a"):
        publisher.receive_data(encode_packet(mqtt.Publish(topic, b"x", qos=1, packet_id=1)),
                               0.0)
    held.settle()
    # the same client id comes back with a token that no longer grants /Secret/**
    back = connect(ctx, "dev", registry, token(["/Public/**"]), clean_session=False)
    held.settle()
    assert published(back) == [("Public/a", b"x")]
    assert back.subscriptions.filters() == {"Public/a": 1}
    assert ctx.stats.entitlement_denials == {"subscribe": 1}
    publisher.receive_data(encode_packet(mqtt.Publish("Secret/plans", b"y", qos=1,
                                                      packet_id=2)), 0.0)
    held.settle()
    assert published(back) == []

