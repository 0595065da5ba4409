"""The read barrier of an MQTT CONNECT (migratory/server/read_barrier.py): held until
everything committed before it is applied here, refused (CONNACK 3) when the barrier
fails or takes too long, coalesced under a storm, and absent from a single server."""

from __future__ import annotations

import pytest
from test_mqtt_session import HeldPublishing, make, read, session

from cluster.coordination import UNNUMBERED_EPOCH
from cluster.publishing import ClusterPublishing
from cluster.replica import Replica
from migratory.config import Config
from migratory.protocol import mqtt, ops
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server import mqtt_input
from migratory.server.app import Server, build_hub
from migratory.server.context import ServerContext
from migratory.server.mqtt_store import SessionRecord, decode_record, session_subject
from migratory.server.publish_rules import message_refusal
from migratory.server.read_barrier import BARRIER_SUBJECT, ReadBarrier


def with_barrier() -> tuple[ServerContext, HeldPublishing, ReadBarrier]:
    ctx, held = make()
    ctx.read_barrier = ReadBarrier(held, clock=lambda: 0.0)
    return ctx, held, ctx.read_barrier


def saved_elsewhere(held: HeldPublishing, client_id: str) -> None:
    """A session record another worker saved (its SUBACK sent there): committed, not
    applied here yet -- it comes before anything this process submits now."""
    record = SessionRecord({"a/+": 1}, {}, generation=1, lineage=1)
    held.submit(record.message(client_id), None, 0.0)


def barriers(held: HeldPublishing) -> int:
    return sum(1 for message, _ in held.held if message.subject == BARRIER_SUBJECT)


def test_a_connect_reads_the_session_once_everything_committed_before_it_is_applied() -> None:
    """Before, the CONNECT read this process's view at once: CONNACK session present 0
    for a session saved elsewhere just before (and a clean one discarded nothing)."""
    ctx, held, _ = with_barrier()
    saved_elsewhere(held, "dev")
    device = session(ctx, "dev", {}, clean_session=False)
    assert read(device) == []  # held for the barrier
    assert barriers(held) == 1
    device.receive_data(encode_packet(mqtt.Pingreq()), 0.0)
    assert read(device) == []  # nothing read before the CONNACK
    held.settle()  # the save, then the barrier behind it
    device.process(0.0)
    assert read(device) == [mqtt.Connack(True, 0), mqtt.Pingresp()]
    clean = session(ctx, "dev", {}, clean_session=True)  # (another worker's registry)
    held.settle()  # its barrier
    clean.process(0.0)
    assert read(clean) == []  # the CONNACK waits for the discard it now knows to make
    held.settle()
    clean.process(0.0)
    assert read(clean) == [mqtt.Connack(False, 0)]
    assert decode_record(ctx.hub.snapshot(session_subject("dev"))) is None  # discarded


def test_a_connect_whose_barrier_fails_is_refused_server_unavailable() -> None:
    ctx, held, barrier = with_barrier()
    device = session(ctx, "dev", {}, clean_session=False)
    ((_, reply),) = held.held
    assert reply is not None
    reply.publish_result(ops.PublishStatus(ops.Status.PUBLISH_FAILED, None, BARRIER_SUBJECT,
                                           None, "outcome unknown"))
    device.process(0.0)
    assert read(device) == [mqtt.Connack(False, mqtt.REFUSED_SERVER_UNAVAILABLE)]
    assert device.closing and barrier.failed == 1


def test_a_connect_whose_barrier_takes_too_long_is_refused_not_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partition: the barrier neither lands nor fails (until ClusterPublishTimeout);
    the CONNECT is refused once READ_BARRIER_WAIT has passed."""
    monkeypatch.setattr(mqtt_input, "READ_BARRIER_WAIT", -1.0)  # already past
    ctx, _, _ = with_barrier()
    device = session(ctx, "dev", {}, clean_session=False)
    assert read(device) == [mqtt.Connack(False, mqtt.REFUSED_SERVER_UNAVAILABLE)]
    assert device.closing


def test_a_storm_of_connects_shares_two_barriers() -> None:
    """1,000 CONNECTs at once: one barrier in flight, the rest join the next one (the
    one in flight may have left before they came); each CONNECT answered after its
    own. Not one barrier (and one wait) per CONNECT."""
    ctx, held, barrier = with_barrier()
    registry: dict = {}
    devices = [session(ctx, f"dev{i}", registry, clean_session=False) for i in range(1000)]
    assert barrier.submitted == 1 and barriers(held) == 1
    assert barrier.waiting == 1000
    held.settle()  # the first lands: the first CONNECT may read; the next barrier leaves
    assert barrier.submitted == 2 and barriers(held) == 1 and barrier.waiting == 999
    devices[1].process(0.0)
    assert read(devices[1]) == []  # its barrier is the second
    held.settle()
    for device in devices:
        device.process(0.0)
        assert read(device) == [mqtt.Connack(False, 0)]
    assert barrier.submitted == 2 and barrier.waiting == 0


def test_an_empty_client_id_needs_no_barrier() -> None:
    ctx, _, barrier = with_barrier()
    anonymous = session(ctx, "", {}, clean_session=True)
    assert read(anonymous) == [mqtt.Connack(False, 0)]
    assert barrier.submitted == 0


def test_only_a_process_whose_stream_is_committed_elsewhere_has_a_barrier() -> None:
    """A single server answers a CONNECT at once (no barrier, no round trip); a
    Guaranteed member or a worker waits for one."""
    config = Config.from_mapping({})
    assert Server(config).ctx.read_barrier is None
    hub = build_hub(config, epoch=UNNUMBERED_EPOCH, numbered_elsewhere=True)
    member = Server(config, hub=hub,
                    publishing=ClusterPublishing(origin="m#1", replica=Replica(hub)))
    assert member.ctx.read_barrier is not None


def test_a_barrier_passes_the_check_a_seed_makes_of_a_members_publish() -> None:
    """The seed or the sequencer checks what a link forwards as a client's publish
    (publish_rules.message_refusal): a barrier it refused (on '/$read-barrier', one
    segment) failed every CONNECT of every worker with CONNACK 3."""
    _, held, barrier = with_barrier()
    barrier.join()
    ((message, _),) = held.held
    assert message_refusal(message, 1024, member=True) is None
