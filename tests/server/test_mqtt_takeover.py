"""migratory/server/mqtt_takeover.py without I/O: two processes (a context, a registry
and a Takeovers each) on one hub and one publish path, CONNECTs of one client id in
each, their takeover notices committed in the order the test settles them."""

from __future__ import annotations

from concurrent.futures import Future

from test_mqtt_session import HeldPublishing, make, read, session

from migratory.entitlement import entitlement_from_config
from migratory.protocol import mqtt, ops
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.context import ServerContext, ServerStatistics
from migratory.server.mqtt_session import MqttSession
from migratory.server.mqtt_store import decode_record, session_subject
from migratory.server.mqtt_takeover import TAKEOVER_SUBJECT, Takeovers


class PassedBarrier:
    """A read barrier that has passed at once (a cluster member's, settled)."""

    def join(self) -> Future[bool]:
        passed: Future[bool] = Future()
        passed.set_result(True)
        return passed


Process = tuple[ServerContext, dict[str, MqttSession]]


def two_processes() -> tuple[HeldPublishing, Process, Process]:
    here, held = make()
    there = ServerContext(here.config, here.hub, entitlement_from_config(here.config),
                          ServerStatistics(), held)
    processes = []
    for ctx in (here, there):
        registry: dict[str, MqttSession] = {}
        ctx.read_barrier = PassedBarrier()  # type: ignore[assignment]
        ctx.takeovers = Takeovers(held, registry, lambda: 0.0)
        ctx.hub.listen(ctx.takeovers, TAKEOVER_SUBJECT, 0)
        processes.append((ctx, registry))
    return held, processes[0], processes[1]


def test_the_connect_committed_last_stays_whichever_came_first() -> None:
    """Two CONNECTs of one client id at once in two processes: each closes the other's
    connection only once its own notice is applied, so the one committed last stays
    (closing on any other token closed both)."""
    for reverse in (False, True):
        held, here, there = two_processes()
        first = session(here[0], "device", here[1])
        second = session(there[0], "device", there[1])
        assert read(first) == [mqtt.Connack(False, 0)] == read(second)
        assert len(held.held) == 2  # a notice each, not committed yet
        if reverse:
            held.held.reverse()
        held.settle()
        stays, closed = (first, second) if reverse else (second, first)
        assert closed.closing and closed.close_code is not None
        assert not stays.closing, "both connections of the client id were closed"


def test_a_later_connect_closes_the_armed_connection_and_its_will_goes() -> None:
    held, here, there = two_processes()
    will = mqtt.Will("dev/status", b"gone", 0, False)
    first = session(here[0], "device", here[1], will=will)
    held.settle()
    assert not first.closing
    second = session(there[0], "device", there[1])
    held.settle()
    assert first.closing and not second.closing
    assert here[0].stats.mqtt_wills_published == 1  # ended without DISCONNECT
    assert [m.subject for m, _ in held.held] == ["/dev/status"]


def test_connects_while_a_notice_is_in_flight_share_the_next() -> None:
    """1,000 CONNECTs at once cost a few notices (NOTICE_BYTES of lines each), not a
    publish each: a storm of reconnects does not fill the publish path."""
    held, here, there = two_processes()
    sessions = [session(here[0], f"device-{n}", here[1]) for n in range(1000)]
    takeovers = here[0].takeovers
    assert isinstance(takeovers, Takeovers)
    assert takeovers.submitted == 1 and len(held.held) == 1
    rounds = 0
    while held.held:
        held.settle()  # each landing submits what came meanwhile
        rounds += 1
    assert takeovers.submitted == rounds <= 4  # the first, then ~450 lines of ~36 bytes each
    later = session(there[0], "device-7", there[1])
    held.settle()
    assert [s.client_id for s in sessions if s.closing] == ["device-7"]
    assert not later.closing


def test_a_client_id_cannot_forge_another_clients_line() -> None:
    """Client ids travel in hex: one holding a newline and a space names no other."""
    held, here, there = two_processes()
    victim = session(here[0], "victim", here[1])
    held.settle()
    forger = session(there[0], "x\nbadc0ffee0ddf00d " + b"victim".hex(), there[1])
    held.settle()
    assert not victim.closing and not forger.closing


def test_a_made_up_client_id_publishes_no_notice() -> None:
    held, here, _ = two_processes()
    session(here[0], "", here[1])
    assert held.held == []


def test_a_connection_whose_notice_failed_can_still_be_taken_over() -> None:
    """A notice refused (no seed majority) closes nothing elsewhere, but its connection is
    armed here: before, never armed, it stayed through every later CONNECT of its id."""
    held, here, there = two_processes()
    first = session(here[0], "device", here[1])
    ((notice, reply),) = held.held
    held.held = []
    assert reply is not None
    reply.publish_result(ops.PublishStatus(ops.Status.PUBLISH_FAILED, None, notice.subject,
                                           None, "no majority"))
    takeovers = here[0].takeovers
    assert isinstance(takeovers, Takeovers) and takeovers.failed == 1
    second = session(there[0], "device", there[1])
    held.settle()
    assert first.closing and not second.closing


def test_two_persistent_connects_at_once_leave_the_session_to_the_one_that_stays() -> None:
    """Two CONNECTs of one persistent session at once in two processes read one record
    and write one generation; the higher writer's record stands (model/snapshot.py), and
    the takeover notices keep the connection committed last. Before, the two orders were
    decided apart: when they disagreed, the connection that stayed found its session
    "taken up by a later connection" at its next save and saved nothing again -- its
    SUBSCRIBE's SUBACK held for ever (or, superseded earlier, sent for a filter never
    saved: gone at the next CONNECT). Now the connection whose record stands is the one
    that stays, whatever order the notices commit in."""
    for notices_first in ("lower", "higher"):
        held, here, there = two_processes()
        device = session(here[0], "device", here[1], clean_session=False)
        device.receive_data(encode_packet(mqtt.Subscribe(1, (("t/x", 1),))), 0.0)
        held.settle()
        device.connection_lost()  # away; its record stored
        held.settle()
        one = session(here[0], "device", here[1], clean_session=False)
        two = session(there[0], "device", there[1], clean_session=False)
        for s in (one, two):
            while s.process(0.0, 1000):
                pass
        records = {s: s._record for s in (one, two)}
        assert all(r is not None for r in records.values())
        lower, higher = sorted((one, two), key=lambda s: records[s].writer)  # type: ignore[union-attr]
        assert records[lower].generation == records[higher].generation  # type: ignore[union-attr]
        first = lower if notices_first == "higher" else higher  # the other's notice last
        held.held.sort(key=lambda m: m[0].subject == TAKEOVER_SUBJECT and (
            m[1] is not (first._ctx.takeovers)))  # its notice before the other's
        held.settle()
        stays = [s for s in (one, two) if not s.closing]
        assert stays == [higher], (notices_first, "the connection whose record lost stayed")
        higher.receive_data(encode_packet(mqtt.Subscribe(2, (("u/y", 1),))), 0.0)
        while higher.process(0.0, 1000):
            pass
        while held.held:
            held.settle()
        assert mqtt.Suback(2, (1,)) in read(higher)
        stored = decode_record(here[0].hub.snapshot(session_subject("device")))
        assert stored is not None and "u/y" in stored.filters


def test_a_connection_whose_session_another_record_took_closes_itself() -> None:
    """Two fresh persistent sessions of one client id at once carry no key (neither
    writes a record at CONNECT; their first saves come with their SUBSCRIBEs): the notices
    keep the one committed last. If the other's first save outranks its own, it closes
    itself when its save lands rather than stay open saving nothing (before: it stayed,
    SUBACKed a filter its session did not hold, and saved nothing again)."""
    held, here, there = two_processes()
    one = session(here[0], "device", here[1], clean_session=False)
    two = session(there[0], "device", there[1], clean_session=False)
    writers = {s: s._record.writer for s in (one, two)}  # type: ignore[union-attr]
    lower, higher = sorted((one, two), key=writers.__getitem__)
    for s in (one, two):
        s.receive_data(encode_packet(mqtt.Subscribe(1, ((f"t/{int(s is higher)}", 1),))), 0.0)
    # the lower's notice last (it stays by the stream's order); the saves after, the
    # higher's first (the other way, the lower's SUBACK goes out before the higher's save
    # lands, and the lower finds its session gone at its next save: docs/mqtt.md)
    held.held.sort(key=lambda m: (m[0].subject != TAKEOVER_SUBJECT,
                                  m[1] is lower._ctx.takeovers or m[1] is lower))
    while held.held:
        held.settle()
    stored = decode_record(here[0].hub.snapshot(session_subject("device")))
    assert stored is not None and set(stored.filters) == {"t/1"}  # the higher's
    assert higher.closing and lower.closing, "left open, its session another's record"
    assert mqtt.Suback(1, (1,)) not in read(lower)


def test_a_keyed_line_reads_as_before_to_a_member_of_an_earlier_version() -> None:
    """The key goes on a line of its own before the CONNECT's: an earlier member's parser
    (token, then the id in hex) skips it and reads the CONNECT's line as always."""
    from migratory.server.mqtt_takeover import notice_line

    text = notice_line("device", "ab12", "3:0:ffee").encode()
    earlier = []
    for line in text.split(b"\n"):  # the parser of a member that predates keys
        token, _, hexed = line.partition(b" ")
        try:
            earlier.append((token, bytes.fromhex(hexed.decode("ascii")).decode("utf-8")))
        except ValueError:
            continue
    assert earlier == [(b"ab12", "device")]
