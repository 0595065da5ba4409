"""The checks of the whole-cluster outage tests (``whole_outage.py``) on hand-made
histories: each finds what it is there for."""

from __future__ import annotations

from whole_outage import replaced, sdk_problems, stream_problems

from migratory.model.message import MessageType
from migratory.model.position import Position
from migratory_client import NotificationStatus

S = "/load/s0"
ACKED = [(b"a", Position(7, 1)), (b"b", Position(7, 2)), (b"c", Position(7, 3))]
UPDATE = MessageType.UPDATE


def sdk(*items: tuple[int, bytes]) -> list[tuple[str, int, int, bytes, MessageType]]:
    return [(S, 7, seq, content, UPDATE) for seq, content in items]


def test_the_sdk_check_passes_every_message_once_in_order() -> None:
    assert sdk_problems(sdk((1, b"a"), (2, b"b"), (3, b"c"), (4, b"x")), [], {S: ACKED}) == []
    assert sdk_problems(sdk((2, b"b"), (3, b"c")), [], {S: ACKED}) == []  # subscribed late


def test_the_sdk_check_finds_a_loss_a_repeat_a_replacement_and_a_resync() -> None:
    assert sdk_problems(sdk((1, b"a"), (3, b"c")), [], {S: ACKED}) == [
        f"sdk {S} {Position(7, 2)}: acknowledged b'b', got None"]
    assert sdk_problems(sdk((1, b"a"), (2, b"b"), (2, b"b"), (3, b"c")), [], {S: ACKED}) == [
        f"sdk {S}: twice or out of order"]
    assert sdk_problems(sdk((1, b"a"), (2, b"z"), (3, b"c")), [], {S: ACKED}) == [
        f"sdk {S} {Position(7, 2)}: acknowledged b'b', got b'z'"]
    assert sdk_problems(sdk((1, b"a"), (2, b"b"), (3, b"c")),
                        [NotificationStatus.DATA_RESYNC], {S: ACKED}) == ["sdk: DATA_RESYNC"]


def test_the_rollback_check_finds_a_delivered_position_the_cluster_now_holds_otherwise(
) -> None:
    held = {(S, p): c for c, p in ACKED}
    got = {S: {p: c for c, p in ACKED}}
    assert replaced(held, got, {S: 7}) == []
    assert replaced({**held, (S, Position(7, 2)): b"z"}, got, {S: 7}) == [
        f"{S} {Position(7, 2)}: delivered b'b', now b'z'"]
    del held[(S, Position(7, 3))]
    assert replaced(held, got, {S: 7}) == [f"{S} {Position(7, 3)}: delivered b'c', now None"]
    assert replaced(held, got, {S: 8}) == []  # another lineage: not compared


def test_the_stream_check_finds_what_mqtt_and_sse_may_not_do() -> None:
    fine = ([b"a", b"b", b"b", b"c"], [(3, False), (1, True)], [b"a", b"b", b"c"], [3, 1])
    assert stream_problems(*fine, ACKED) == []
    payloads, sessions, sse, streams = fine
    assert stream_problems([b"a", b"c"], sessions, sse, streams, ACKED) == ["mqtt lost b'b'"]
    assert stream_problems([b"a", b"c", b"b"], sessions, sse, streams, ACKED) == [
        "mqtt out of order"]
    assert stream_problems(payloads, [(3, False), (1, False)], sse, streams, ACKED) == [
        "mqtt sessions [(3, False), (1, False)]"]
    assert stream_problems(payloads, sessions, [b"a", b"b", b"b", b"c"], streams, ACKED) == [
        "sse twice or resync"]
    assert stream_problems(payloads, sessions, [b"a", b"resync", b"b", b"c"], streams,
                           ACKED) == ["sse twice or resync"]
    assert stream_problems(payloads, sessions, [b"b", b"a", b"c"], streams, ACKED) == [
        "sse out of order"]
    assert stream_problems(payloads, [(3, False)], [b"a", b"c"], [3], ACKED) == [
        "mqtt sessions [(3, False)]", "sse lost b'b'", "sse streams [3]"]
