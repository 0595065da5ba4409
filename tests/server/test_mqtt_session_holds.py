"""A Standard member's hub keeps the filters of its persistent MQTT sessions while their
clients are away (``SessionHolds``, migratory/server/hub_sinks.py), so that ``Hub.made``
says someone here may miss a peer's forward of a subject only an away session wants
(the real-process shape: tests/cluster/test_cluster_standard_offline_session.py). Bytes
in, the hub's answer out; released by an UNSUBSCRIBE, a clean session of the client id,
the expiry sweep."""

from __future__ import annotations

import pytest
from test_mqtt_expiry import EXPIRY, T0, wall  # noqa: F401 (the fixture)
from test_mqtt_session import HeldPublishing, Wire, session

from migratory.config import Config
from migratory.entitlement import entitlement_from_config
from migratory.protocol import mqtt
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.app import build_hub
from migratory.server.context import ServerContext, ServerStatistics
from migratory.server.hub_sinks import SessionHolds
from migratory.server.mqtt_expiry import SessionExpiry
from migratory.server.mqtt_session import MqttSession
from migratory.server.mqtt_store import SessionRecord


def standard(**settings: str) -> tuple[ServerContext, HeldPublishing]:
    config = Config.from_mapping(settings)
    hub = build_hub(config, hold_sessions=True)
    held = HeldPublishing(hub)
    ctx = ServerContext(config, hub, entitlement_from_config(config), ServerStatistics(), held)
    return ctx, held


def away(ctx: ServerContext, held: HeldPublishing, registry: dict,
         filters: tuple[str, ...] = ("a/b", "c/#")) -> MqttSession:
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, tuple((f, 1) for f in filters))), 0.0)
    held.settle()
    device.connection_lost()
    held.settle()
    return device


def test_an_away_persistent_sessions_filters_are_still_held() -> None:
    ctx, held = standard()
    registry: dict = {}
    before = ctx.hub.holdings_made
    away(ctx, held, registry)
    assert ctx.hub.position("/a/b") is None  # nothing of it held in the hub's subjects
    made = ctx.hub.made("/a/b")
    assert made is not None and made > before
    assert ctx.hub.made("/c/d/e") is not None
    assert ctx.hub.made("/x/y") is None
    assert ctx.hub.made("/$mqtt-session/00") is None  # (no filter is told of those)


def test_a_hub_of_a_server_alone_holds_no_away_session() -> None:
    config = Config.from_mapping({})
    hub = build_hub(config)
    held = HeldPublishing(hub)
    ctx = ServerContext(config, hub, entitlement_from_config(config), ServerStatistics(), held)
    away(ctx, held, {})
    assert hub.made("/a/b") is None and hub.made("/c/d") is None


def test_a_resume_keeps_the_age_of_the_filters() -> None:
    """The session resumed here: its filters were held all along, from the first
    SUBSCRIBE -- not only since the resume (a peer met meanwhile may have lost some)."""
    ctx, held = standard()
    registry: dict = {}
    away(ctx, held, registry)
    ages = ctx.hub.made("/a/b"), ctx.hub.made("/c/d")
    back = MqttSession(ctx, Wire(), "127.0.0.1:2", registry)  # type: ignore[arg-type]
    back.receive_data(encode_packet(mqtt.Connect("dev", clean_session=False)), 1.0)
    while back.process(1.0, 1000):
        pass
    held.settle()
    assert (ctx.hub.made("/a/b"), ctx.hub.made("/c/d")) == ages
    back.connection_lost()
    assert (ctx.hub.made("/a/b"), ctx.hub.made("/c/d")) == ages


def test_an_unsubscribe_releases_the_filter() -> None:
    ctx, held = standard()
    registry: dict = {}
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/b", 1), ("c/#", 1)))), 0.0)
    held.settle()
    device.receive_data(encode_packet(mqtt.Unsubscribe(2, ("c/#",))), 0.0)
    held.settle()
    device.connection_lost()
    assert ctx.hub.made("/c/d") is None and ctx.hub.made("/a/b") is not None


def test_a_filter_subscribed_again_keeps_its_age() -> None:
    """MQTT replaces a subscription subscribed again: the session held it all along."""
    ctx, held = standard()
    registry: dict = {}
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("c/#", 1),))), 0.0)
    held.settle()
    age = ctx.hub.made("/c/d")
    device.receive_data(encode_packet(mqtt.Subscribe(2, (("c/#", 0),))), 0.0)
    held.settle()
    device.connection_lost()
    assert ctx.hub.made("/c/d") == age


def test_a_clean_session_of_the_client_id_releases_them() -> None:
    ctx, held = standard()
    registry: dict = {}
    away(ctx, held, registry)
    session(ctx, "dev", registry, clean_session=True)
    held.settle()
    assert ctx.hub.made("/c/d") is None


def test_the_expiry_sweep_releases_a_discarded_session(wall: list[float]) -> None:  # noqa: F811
    ctx, held = standard(MqttSessionExpiry=str(EXPIRY))
    registry: dict = {}
    away(ctx, held, registry)
    wall[0] = T0 + EXPIRY + 1
    assert SessionExpiry(ctx, registry).sweep(0.0, 100) == 1
    assert ctx.hub.made("/c/d") is None


def test_holds_count_each_client_once_and_release_only_their_own() -> None:
    holds = SessionHolds()
    assert holds.hold("one", ("a", "b"), 1)
    assert not holds.hold("one", ("a", "b"), 2)  # (a resume's hand-over: the same hold)
    assert not holds.hold("two", ("a", "b"), 3)
    assert holds.oldest("/a/b") == 1
    holds.release("one", None)
    assert holds.oldest("/a/b") == 1  # (two still holds it: kept, the older age)
    holds.release("two", ("x", "y"))  # not held by it: nothing
    assert holds.oldest("/a/b") == 1
    holds.release("two", ("a", "b"))
    assert holds.oldest("/a/b") is None and len(holds) == 0


@pytest.mark.parametrize("filters", [("a/b",), ("+/b",), ("#",)])
def test_any_filter_shape_is_held(filters: tuple[str, ...]) -> None:
    ctx, held = standard()
    away(ctx, held, {}, filters)
    assert ctx.hub.made("/a/b") is not None


def test_a_resume_from_another_members_newer_record_releases_the_filters_it_dropped() -> None:
    """The session went on on another member, which UNSUBSCRIBEd ``c/#`` and subscribed
    ``x/#``; its record came here. Resumed here, the session holds the record's filters
    alone: before, ``c/#`` stayed held (delivered nothing, but counted as held until the
    record was discarded, 7 days by default: a needless resync at each peer's restart)."""
    ctx, held = standard()
    registry: dict = {}
    away(ctx, held, registry)
    newer = SessionRecord({"a/b": 1, "x/#": 1}, generation=10**12)
    ctx.publishing.submit(newer.message("dev"), None, 0.0)  # (forwarded from the peer)
    held.settle()
    back = MqttSession(ctx, Wire(), "127.0.0.1:2", registry)  # type: ignore[arg-type]
    back.receive_data(encode_packet(mqtt.Connect("dev", clean_session=False)), 1.0)
    while back.process(1.0, 1000):
        pass
    held.settle()
    assert ctx.hub.made("/c/d") is None, "the dropped filter is still held"
    assert ctx.hub.made("/a/b") is not None and ctx.hub.made("/x/y") is not None
    back.connection_lost()
    held.settle()
    assert ctx.hub.made("/c/d") is None and ctx.hub.made("/x/y") is not None
