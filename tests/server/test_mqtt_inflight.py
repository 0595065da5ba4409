"""The QoS 1 deliveries MQTT subscribers have not acknowledged (mqtt_inflight.py) count
against the server's OutboxMemoryBudget, as queued bytes do."""

from __future__ import annotations

import gc

from test_mqtt_session import make, read, session

from migratory.model.outbox import OutboxBudget
from migratory.model.position import Position
from migratory.protocol import mqtt
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.mqtt_inflight import ENTRY_BYTES, Inflight


def test_subscribers_that_never_acknowledge_are_bounded_by_the_outbox_budget() -> None:
    """Five QoS 1 subscribers that read every message and send no PUBACK, each under its
    own limit (1,600 entries): they held 5 x 1,000 entries, 880,000 bytes, with an
    OutboxMemoryBudget of 176,000 -- counted nowhere (1,000 such connections: 4 GiB past
    a 1 GiB budget). Past the budget, a session holding more than a sixteenth of its
    limit is now cut off as a slow consumer."""
    ctx, held = make(MaxPublishesPerSecond="0", MaxMessageSize="4096",
                     ClientMaxPendingBytes=str(1600 * ENTRY_BYTES),
                     OutboxMemoryBudget=str(1000 * ENTRY_BYTES))
    budget = ctx.outbox_budget = OutboxBudget(ctx.config.outbox_memory_budget)
    publisher = session(ctx, "pub", {})
    devices = [session(ctx, f"dev{i}", {}) for i in range(5)]
    for device in devices:
        device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/b", 1),))), 0.0)
    held.settle()
    for device in devices:
        read(device)
    for n in range(1, 1001):
        publisher.receive_data(encode_packet(mqtt.Publish("a/b", b"x", qos=1, packet_id=n)),
                               0.0)
        held.settle()
        read(publisher)
        for device in devices:
            read(device)
    outstanding = sum(len(device._inflight) for device in devices if not device.closing)
    assert outstanding * ENTRY_BYTES <= budget.limit
    assert [d.closing for d in devices].count(True) >= 4
    for device in devices:
        device.release()
    assert budget.used == 0


def test_acknowledged_and_released_entries_leave_the_budget() -> None:
    budget = OutboxBudget(10 * ENTRY_BYTES)
    inflight = Inflight(limit=32, budget=budget)
    ids = [inflight.add("/a/b", Position(1, seq)) for seq in range(1, 5)]
    assert budget.used == 4 * ENTRY_BYTES
    assert inflight.acknowledge(ids[1]) == ("/a/b", None)  # early: still held
    assert budget.used == 4 * ENTRY_BYTES
    assert inflight.acknowledge(ids[0]) == ("/a/b", Position(1, 2))  # both go
    assert budget.used == 2 * ENTRY_BYTES
    seq = 4
    while inflight.full() is None:  # its own limit is 32: the budget (10) stops it
        seq += 1
        inflight.add("/a/b", Position(1, seq))
    assert len(inflight) == 10 and budget.used == budget.limit
    assert "OutboxMemoryBudget" in (inflight.full() or "")
    inflight.release()
    assert budget.used == 0 and len(inflight) == 0


def test_in_flight_entries_are_not_tracked_by_the_garbage_collector() -> None:
    """Each entry held a Position of its own (``Message.position`` makes one), so it and
    its tuple stayed tracked: 10,000 QoS 1 sessions holding 400 deliveries each were 8
    million objects every full collection walked (1.4 s, docs/benchmarks.md). An entry
    now holds its position as integers: after a collection the entries add nothing the
    collector tracks (2,000 objects before), and a PUBACK still reports its position."""
    inflight = Inflight()
    gc.collect()
    tracked = len(gc.get_objects())
    ids = [inflight.add("/a/b", Position(2**40, seq)) for seq in range(1, 1001)]
    gc.collect()
    assert len(gc.get_objects()) - tracked < 10
    assert inflight.acknowledge(ids[0]) == ("/a/b", Position(2**40, 1))
    assert inflight.acknowledge(ids[1]) == ("/a/b", Position(2**40, 2))
