"""migratory/server/mqtt_takeover.py without I/O: two processes (a registry and a
listener each) on one hub, CONNECTs of one client id in each, their takeover notices
committed in the order the test settles them."""

from __future__ import annotations

from concurrent.futures import Future

from test_mqtt_session import HeldPublishing, make, read, session

from migratory.protocol import mqtt
from migratory.server.context import ServerContext
from migratory.server.mqtt_session import MqttSession
from migratory.server.mqtt_takeover import TAKEOVER_SUBJECT, TakeoverNotices


class PassedBarrier:
    """A read barrier that has passed at once (a cluster member's, settled)."""

    def join(self) -> Future[bool]:
        passed: Future[bool] = Future()
        passed.set_result(True)
        return passed


def two_processes() -> tuple[
    HeldPublishing, ServerContext, dict[str, MqttSession], dict[str, MqttSession]
]:
    ctx, held = make()
    ctx.read_barrier = PassedBarrier()  # type: ignore[assignment]
    here: dict[str, MqttSession] = {}
    there: dict[str, MqttSession] = {}
    for registry in (here, there):
        ctx.hub.listen(TakeoverNotices(registry), TAKEOVER_SUBJECT, 0)
    return held, ctx, here, there


def test_the_connect_committed_last_stays_whichever_came_first() -> None:
    """Two CONNECTs of one client id at once in two processes: each closes the other's
    connection only once its own notice is applied, so the one committed last stays
    (closing on any other token closed both)."""
    for reverse in (False, True):
        held, ctx, here, there = two_processes()
        first = session(ctx, "device", here)
        second = session(ctx, "device", there)
        assert read(first) == [mqtt.Connack(False, 0)] == read(second)
        assert len(held.held) == 2  # a notice each, not committed yet
        if reverse:
            held.held.reverse()
        held.settle()
        stays, closed = (first, second) if reverse else (second, first)
        assert closed.closing and closed.close_code is not None
        assert not stays.closing, "both connections of the client id were closed"


def test_a_later_connect_closes_the_armed_connection_and_its_will_goes() -> None:
    held, ctx, here, there = two_processes()
    first = session(ctx, "device", here, will=mqtt.Will("dev/status", b"gone", 0, False))
    held.settle()
    assert not first.closing
    second = session(ctx, "device", there)
    held.settle()
    assert first.closing and not second.closing
    assert ctx.stats.mqtt_wills_published == 1  # ended without DISCONNECT
    assert [m.subject for m, _ in held.held] == ["/dev/status"]


def test_a_made_up_client_id_publishes_no_notice() -> None:
    held, ctx, here, _ = two_processes()
    session(ctx, "", here)
    assert held.held == []
