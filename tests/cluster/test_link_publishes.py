"""A peer's publishes over the cluster link are checked as a client's are
(cluster/link_publishes.py, publish_rules.message_refusal), against a real
:class:`PeerService` on loopback (Guaranteed: a non-seed's forward to a seed) and a real
Standard member's link listener.

Before, a member with the ClusterPassword had anything numbered and fanned out: the
seeds' invalid subjects, a 70,000-byte subject (which made the hub raise in an MQTT ``#``
subscriber's delivery), content past MaxMessageSize. Now each is answered to its origin
(``ForwardFailed``: its client gets PUBLISH_FAILED once), counted, logged once a minute
per peer and status, and the link stays up; the valid publishes of the same forward are
numbered once each. What the sender set of the server's own (epoch, seq, type, closure)
was never kept: pinned here too.
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from pathlib import Path

import pytest
import trio
from cluster_link_pair import frame
from listen_ports import listen_port
from test_link_attacks import (
    ATTACKER,
    FOLLOWER,
    MINE,
    PASSWORD,
    Seed,
    answer_of,
    attacked,
    violations,
)

from cluster import link
from cluster.coordination import UNNUMBERED_EPOCH, Coordinator, PublishRequest
from cluster.link_io import LinkChannel, connect
from cluster.replica import Offer, Replica
from cluster.standard import StandardNode
from migratory.config import Config, load_config
from migratory.model.message import Message, MessageType, Qos
from migratory.model.position import new_position
from migratory.protocol import mqtt
from migratory.protocol.mqtt_encode import encode_packet

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "model"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from test_model_subject import TABLE_4_2  # the seeds' table of invalid subjects
from test_mqtt_session import make, read, session

THEIRS = f"{ATTACKER}#5"
LONG_SUBJECT = "/a/" + "x" * 70_000  # no MQTT topic: at most 65,535 bytes
OVERSIZE = b"x" * (load_config(environ={}).max_message_size + 1)

INVALID = [Message(subject, b"bad") for subject, _ in TABLE_4_2] + [
    Message("", b"bad"), Message("/a/b\x00", b"nul"), Message(LONG_SUBJECT, b"long"),
    Message("/a/b", OVERSIZE),
]
TAKEN = [
    Message("/a/b", b"ok-1", qos=Qos.GUARANTEED),
    Message("/$mqtt-session/6162", b"record", {"/a/b": "1:2:3"}, retained=True),  # a member's
    Message("/a/c", b"forged position", closure="c1", epoch=99, seq=1000,
            type=MessageType.SNAPSHOT),
    Message("/a/b", b"ok-2"),
]


def mixed_forward() -> tuple[list[PublishRequest], set[int], set[int]]:
    """One forward of valid and invalid publishes interleaved: (requests, valid refs,
    invalid refs)."""
    requests, good, bad = [], set(), set()
    valid, invalid = list(TAKEN), list(INVALID)
    ref = 0
    while valid or invalid:
        for pool, refs in ((valid, good), (invalid, bad)):
            if pool:
                ref += 1
                requests.append(PublishRequest(THEIRS, ref, pool.pop(0)))
                refs.add(ref)
    return requests, good, bad


async def answers_until(channel: LinkChannel, ref: int) -> tuple[list[link.Batch],
                                                                 list[link.ForwardFailed]]:
    """What the attacker's link brings until the batch that numbers its ``ref``."""
    batches, failed = [], []
    with trio.fail_after(5):
        while True:
            op = await channel.receive()
            assert op is not None, "the attacker's link ended"
            if isinstance(op, link.ForwardFailed):
                failed.append(op)
            elif isinstance(op, link.Batch):
                batches.append(op)
                if (THEIRS, ref) in op.batch.origins:
                    return batches, failed


def run_seed(attack: object) -> tuple[Seed, object]:
    seed = Seed(listen_port())
    submitted: list[int] = []
    take = seed.take_forward

    def counted(peer: str, requests: object) -> None:
        submitted.append(len(requests))  # type: ignore[arg-type]
        take(peer, requests)  # type: ignore[arg-type]

    seed.service.take_forward = counted
    seed.submitted = submitted  # type: ignore[attr-defined]

    async def main() -> object:
        async with trio.open_nursery() as nursery:
            await nursery.start(seed.service.run, ("127.0.0.1", seed.port))
            result = await attack(seed)  # type: ignore[operator]
            nursery.cancel_scope.cancel()
        return result

    return seed, trio.run(main)


def test_a_forward_mixing_valid_and_invalid_publishes(caplog: pytest.LogCaptureFixture) -> None:
    """Before: all 13 numbered, the invalid subjects and the 128 KiB + 1 content
    included, and no ForwardFailed. Now the 9 invalid ones come back as ForwardFailed
    (each origin once, its status in the reason), the 4 others are numbered once each,
    in order, with the server's positions; the link stays up and takes a next forward."""
    requests, good, bad = mixed_forward()

    async def attack(seed: Seed) -> tuple[list[link.Batch], list[link.ForwardFailed]]:
        attacker = await seed.dial(ATTACKER)
        ended = seed.service.links_ended
        await attacker.send(link.Forward(tuple(requests)))
        batches, failed = await answers_until(attacker, max(good))
        await attacker.send(link.Forward((PublishRequest(THEIRS, 100, Message("/a/b", b"next")),)))
        more, _ = await answers_until(attacker, 100)
        assert seed.service.links_ended == ended
        await attacker.aclose()
        return batches + more, failed

    caplog.set_level(logging.WARNING, logger="migratory.cluster")
    seed, result = run_seed(attack)
    batches, failed = result  # type: ignore[misc]
    numbered = [(o, m) for b in batches for o, m in zip(b.batch.origins, b.batch.messages,
                                                        strict=True)]
    assert sorted(ref for (_, ref), _ in numbered) == sorted(good | {100})
    assert [m.content for _, m in numbered] == [m.content for m in TAKEN] + [b"next"]
    forged = next(m for _, m in numbered if m.subject == "/a/c")
    assert (forged.epoch, forged.seq, forged.type, forged.closure) == (7, 1, MessageType.UPDATE,
                                                                       None)
    refused = Counter(ref for answer in failed for _, ref in answer.origins)
    assert refused == Counter(bad)  # each once
    assert all(not answer.unknown for answer in failed)
    reasons = {answer.reason.split(":")[0] for answer in failed}
    assert reasons == {"PUBLISH_FAILED", "MESSAGE_SIZE_LIMIT_EXCEEDED"}
    # was: no status (its publisher got PUBLISH_FAILED for a message too large)
    assert all(answer.reason.startswith(f"{answer.status.value}: ") for answer in failed)
    assert seed.service.publishes.refused == {"PUBLISH_FAILED": 8,
                                              "MESSAGE_SIZE_LIMIT_EXCEEDED": 1}
    assert violations(seed) == {}
    warnings = [r.getMessage() for r in caplog.records if "refused a publish" in r.getMessage()]
    assert len(warnings) == 2, warnings  # once per status, not once per publish


def test_a_flood_of_invalid_forwards_is_answered_and_submits_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """2,000 forwards of one invalid publish each, in one write, then one valid: each
    answered once, none submitted (Raft sees only the valid one), one warning; another
    member's forward meanwhile is numbered as usual."""
    flood = b"".join(
        link.encode_frame(link.Forward((PublishRequest(THEIRS, ref, Message("/a//b", b"x")),)))
        for ref in range(1, 2001))

    async def attack(seed: Seed) -> tuple[int, list[bytes]]:
        attacker = await seed.dial(ATTACKER)
        follower = await seed.dial(FOLLOWER)
        await attacker.stream.send_all(flood)
        await attacker.send(link.Forward((PublishRequest(THEIRS, 2001, Message("/a/b", b"ok")),)))
        await follower.send(link.Forward((PublishRequest(MINE, 1, Message("/a/b", b"mine")),)))
        batches, failed = await answers_until(attacker, 2001)
        answered = sum(len(f.origins) for f in failed)
        contents = [m.content for b in batches for m in b.batch.messages
                    if m.content == b"ok"]
        mine = await answer_of(follower, 1)
        contents += [m.content for m in mine.batch.messages if m.content == b"mine"]
        await attacker.aclose()
        await follower.aclose()
        return answered, contents

    caplog.set_level(logging.WARNING, logger="migratory.cluster")
    seed, result = run_seed(attack)
    answered, contents = result  # type: ignore[misc]
    assert answered == 2000
    assert sorted(contents) == [b"mine", b"ok"]
    assert seed.submitted == [1, 1]  # type: ignore[attr-defined]
    assert seed.service.publishes.refused["PUBLISH_FAILED"] == 2000
    assert sum("refused a publish" in r.getMessage() for r in caplog.records) == 1


def test_fields_of_the_wrong_type_end_the_link_and_number_nothing() -> None:
    """Not a message (fields {1: 2}): refused where the frame is read, before any check;
    the link ends (a peer that sends what no member writes is broken or hostile), the
    other members' forwards go on. As before; pinned."""
    body = {"t": "fw", "r": [[THEIRS, 1, ["/a/b", b"x", {1: 2}, 0, None, 0, 0, 0]]]}

    async def send(seed: Seed, attacker: LinkChannel) -> None:
        await attacker.stream.send_all(frame(body))

    seed, batches = attacked(send)
    assert seed.service.links_ended >= 1
    assert [m.content for m in batches[0].batch.messages] == [b"mine"]
    assert seed.coordinator.clsn == 1  # the follower's publish only


def test_a_committed_batch_that_fails_the_check_is_applied_as_committed() -> None:
    """A batch committed before the check (an older seed's log, a forward taken by an
    older seed) with a 70,000-byte subject between two valid publishes, applied by a
    member whose hub has an MQTT '#' subscriber. Before: the delivery raised in the
    hub half-way through the batch, the replica called it a gap (Offer.GAP: /a/b
    applied, /a/c not, the member waiting for a whole cache sync) -- on every member
    with such a subscriber, at every such batch. Now it is applied whole, each position
    kept (none vanishes), and the device gets the valid ones."""
    ctx, held = make()
    ctx.hub.epoch = UNNUMBERED_EPOCH  # a cluster member's hub
    device = session(ctx, "dev", {})
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("#", 0),))), 0.0)
    held.settle()
    read(device)
    replica = Replica(ctx.hub)
    batch = Coordinator().apply_batch(7, [
        PublishRequest(THEIRS, 1, Message("/a/b", b"before")),
        PublishRequest(THEIRS, 2, Message(LONG_SUBJECT, b"long")),
        PublishRequest(THEIRS, 3, Message("/a/c", b"after")),
    ])
    assert replica.offer(batch, 0.0) is Offer.APPLIED
    assert replica.applied_clsn == 1 and not replica.needs_sync
    for subject in ("/a/b", LONG_SUBJECT, "/a/c"):
        assert ctx.hub.position(subject) == new_position(7, 1)
    assert [p.topic for p in read(device) if isinstance(p, mqtt.Publish)] == ["a/b", "a/c"]


# --- Standard mode -----------------------------------------------------------------


def standard_member(port: int, peer: str) -> StandardNode:
    return StandardNode(Config.from_mapping({
        "Listen": "127.0.0.1:0", "ClusterDeliveryMode": "Standard", "ClusterPassword": PASSWORD,
        "ClusterMembers": f"127.0.0.1:{port}, {peer}, 127.0.0.1:3",
        "ClusterMemberListen": f"127.0.0.1:{port}",
    }))


def test_a_standard_members_publishes_are_checked_as_a_clients(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: ``hub.publish`` took every StandardPublish (the invalid ones numbered,
    in the cache, fanned out). Now the invalid are refused (counted, logged once per
    status) and the link stays up: the valid ones after them are published, with this
    member's positions (the sender's epoch, seq, type and closure are not kept)."""
    port = listen_port()
    node = standard_member(port, ATTACKER)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            channel = await connect(("127.0.0.1", port), member=ATTACKER, password=PASSWORD,
                                    max_frame=link.MAX_FRAME)
            for message in [TAKEN[0], *INVALID, *TAKEN[1:]]:
                await channel.send(link.StandardPublish(message))
            with trio.fail_after(5):
                while node.hub.position("/a/b") is None or node.hub.position("/a/b").seq < 2:
                    await trio.sleep(0.01)
            await channel.aclose()
            nursery.cancel_scope.cancel()

    caplog.set_level(logging.WARNING, logger="migratory.cluster")
    trio.run(main)
    hub = node.hub
    assert sorted(hub.subject_names()) == ["/$mqtt-session/6162", "/a/b", "/a/c"]
    (cached,) = [run.messages() for subject, _, _, run in hub.numbered() if subject == "/a/c"]
    (forged,) = cached
    assert (forged.epoch, forged.seq, forged.type, forged.closure) == (
        hub.epoch, 1, MessageType.UPDATE, None)
    assert node.publishes.refused == {"PUBLISH_FAILED": 8, "MESSAGE_SIZE_LIMIT_EXCEEDED": 1}
    assert node.handshakes.violations.get("frame_size", 0) == 0
    assert sum("refused a publish" in r.getMessage() for r in caplog.records) == 2
