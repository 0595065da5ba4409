"""The link's bounds and its protocol version, bytes in, events out (cluster/link_limits.py).

- Versions: version 1 is the wire of the members before versions (pinned byte for byte
  in test_cluster_link.py); members of two versions refuse each other in the handshake,
  each side saying both versions, before any operation is parsed; a MITM that strips
  or changes ``v`` breaks the MACs.
- Frame sizes: an acceptor takes at most ``accepted_frame_limit(MaxFrameSize)``, refused
  from the length prefix; a connector keeps MAX_FRAME. What members send fits: a forward
  of FORWARD_BYTES plus one largest publish, the batch of a seed's largest command.
- The decoders of the versioned handshake, fuzzed: whole, a byte at a time, trailing.
"""

from __future__ import annotations

import struct
from typing import Any

import cbor2
import pytest
from cluster_link_pair import ACCEPTOR, CONNECTOR, PASSWORD, drain, frame, payload_of
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import link
from cluster.cache_sync import CacheSync, SubjectSync
from cluster.commit_window import MAX_COMMAND_BYTES
from cluster.coordination import UNNUMBERED_EPOCH, Coordinator
from cluster.link import Authenticated, Heartbeat, LinkConnection, LinkError, Outgoing
from cluster.link_limits import (
    FORWARD_BYTES,
    LINK_VERSION,
    FrameTooLarge,
    VersionMismatch,
    accepted_frame_limit,
    connected_frame_limit,
)
from cluster.publishing import ClusterPublishing
from cluster.replica import Replica
from migratory.config import ConfigError, load_config
from migratory.config_sizes import LINKED_MAX_FRAME_SIZE
from migratory.model.message import Message
from migratory.server.hub import Hub

DEFAULT_MAX_FRAME_SIZE = load_config(environ={}).max_frame_size


class Acceptor(LinkConnection):
    """An acceptor whose challenge can be read again after initiate()."""

    def initiate_again(self) -> bytes:
        return self._challenge

    def initiate(self) -> bytes:
        self._challenge = super().initiate()
        return self._challenge


def conn(role: Any, version: int = LINK_VERSION, **kw: Any) -> LinkConnection:
    member = ACCEPTOR if role == "accept" else CONNECTOR
    cls = Acceptor if role == "accept" else LinkConnection
    c = cls(role=role, member=member, password=PASSWORD, version=version, **kw)
    c.initiate()
    return c


def handshake(acceptor: LinkConnection, connector: LinkConnection) -> list[Any]:
    """Run the handshake; each side's events, and the LinkError that ended it."""
    seen: list[Any] = []
    try:
        connector.receive_data(acceptor._pending_challenge)  # type: ignore[attr-defined]
        for event in drain(connector):
            seen.append(("connector", type(event).__name__))
            if isinstance(event, Outgoing):
                acceptor.receive_data(event.data)
        for event in drain(acceptor):
            seen.append(("acceptor", type(event).__name__))
            if isinstance(event, Outgoing):
                connector.receive_data(event.data)
        seen += [("connector", type(e).__name__) for e in drain(connector)]
    except LinkError as exc:
        seen.append(exc)
    return seen


def linked(acceptor_version: int, connector_version: int) -> list[Any]:
    acceptor = LinkConnection(role="accept", member=ACCEPTOR, password=PASSWORD,
                              version=acceptor_version)
    connector = LinkConnection(role="connect", member=CONNECTOR, password=PASSWORD,
                               version=connector_version)
    acceptor._pending_challenge = acceptor.initiate()  # type: ignore[attr-defined]
    connector.initiate()
    return handshake(acceptor, connector)


# --- versions ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2, 7])
def test_members_of_one_version_link(version: int) -> None:
    assert linked(version, version) == [
        ("connector", "Outgoing"), ("acceptor", "Outgoing"), ("acceptor", "Authenticated"),
        ("connector", "Authenticated"),
    ]


def test_version_1_leaves_the_key_out_and_a_later_one_names_itself() -> None:
    assert "v" not in payload_of(conn("accept", 1).initiate_again())  # type: ignore[attr-defined]
    assert payload_of(conn("accept", 2).initiate_again())["v"] == 2  # type: ignore[attr-defined]


def test_a_connector_refuses_an_acceptor_of_another_version_saying_both() -> None:
    (refusal,) = linked(acceptor_version=2, connector_version=1)
    assert isinstance(refusal, VersionMismatch)
    assert refusal.reason == (
        f"{ACCEPTOR} speaks cluster link protocol version 2, this member 1: upgrade this "
        "member too (docs/cluster.md, Upgrading)")
    (refusal,) = linked(acceptor_version=1, connector_version=2)
    assert isinstance(refusal, VersionMismatch)
    assert "version 1, this member 2: it must be upgraded too" in refusal.reason


def test_an_acceptor_refuses_an_auth_of_another_version_before_its_mac() -> None:
    """A connector that did not check (or lied about) the challenge's version."""
    acceptor = conn("accept", 1)
    auth = {"t": "auth", "m": CONNECTOR, "n": bytes(16), "mac": bytes(32), "v": 3}
    acceptor.receive_data(frame(auth))
    with pytest.raises(VersionMismatch, match=f"^{CONNECTOR} speaks cluster link protocol "
                       "version 3, this member 1"):
        acceptor.next_event()


def test_a_version_changed_on_the_way_breaks_the_macs() -> None:
    """A man in the middle without the password between a version-2 acceptor and a
    version-1 connector strips ``v`` from the challenge and adds it to the auth, so
    that each side believes the other its own version: the MACs are labelled with the
    version, and the acceptor refuses the connector's proof."""
    acceptor, connector = conn("accept", 2), conn("connect", 1)
    challenge = payload_of(acceptor.initiate_again())  # type: ignore[attr-defined]
    del challenge["v"]
    connector.receive_data(frame(challenge))
    (auth,) = drain(connector)
    body = payload_of(auth.data)
    acceptor.receive_data(frame({**body, "v": 2}))
    with pytest.raises(LinkError, match=r"^authentication failed: bad mac"):
        acceptor.next_event()


def test_a_version_that_is_no_integer_is_an_authentication_failure() -> None:
    connector = conn("connect")
    connector.receive_data(frame({"t": "challenge", "n": bytes(16), "m": ACCEPTOR, "v": "2"}))
    with pytest.raises(LinkError, match=r"^authentication failed: 'challenge' frame: 'v' must"):
        connector.next_event()


# --- frame sizes ------------------------------------------------------------------------


def test_an_acceptor_refuses_a_frame_above_its_limit_from_the_length_prefix() -> None:
    limit = accepted_frame_limit(DEFAULT_MAX_FRAME_SIZE)
    assert limit < link.MAX_FRAME // 16  # 3 MiB by default, where any peer had 64 MiB
    acceptor, _ = open_limited(limit)
    acceptor.receive_data(struct.pack(">I", limit))
    assert acceptor.next_event() is None  # the limit itself is taken
    for size in (limit + 1, 2**31, 2**32 - 1):
        acceptor, _ = open_limited(limit)
        acceptor.receive_data(struct.pack(">I", size))
        with pytest.raises(FrameTooLarge) as refused:
            acceptor.next_event()
        assert (refused.value.size, refused.value.limit, refused.value.rule) == (
            size, limit, "frame_size")
        assert acceptor.buffered == 4  # nothing of it was waited for


def test_the_limit_follows_max_frame_size_and_stays_within_max_frame() -> None:
    assert accepted_frame_limit(1 << 20) < accepted_frame_limit(4 << 20)
    assert accepted_frame_limit(1 << 30) == link.MAX_FRAME
    with pytest.raises(ValueError, match="max_frame"):
        LinkConnection(role="accept", member=ACCEPTOR, password=PASSWORD,
                       max_frame=link.MAX_FRAME + 1)


def open_limited(limit: int) -> tuple[LinkConnection, LinkConnection]:
    acceptor = LinkConnection(role="accept", member=ACCEPTOR, password=PASSWORD, max_frame=limit)
    connector = LinkConnection(role="connect", member=CONNECTOR, password=PASSWORD)
    acceptor._pending_challenge = acceptor.initiate()  # type: ignore[attr-defined]
    connector.initiate()
    assert handshake(acceptor, connector)[-1] == ("connector", "Authenticated")
    return acceptor, connector


def new_publishing() -> ClusterPublishing:
    return ClusterPublishing(origin=f"{CONNECTOR}#1", replica=Replica(Hub(epoch=UNNUMBERED_EPOCH)))


def largest_publish(i: int, *, fields: bool) -> Message:
    """A publish as large as the default MaxMessageSize lets it be, by content or by
    one-character fields (a cache counts FIELD_OVERHEAD more for each)."""
    size = load_config(environ={}).max_message_size - 16
    if not fields:
        return Message(f"/big/{i}", bytes(size), closure="c" * 1000)
    names = [f"{n:x}" for n in range(size // 8)]
    return Message(f"/big/{i}", b"", fields=dict.fromkeys(names, "v"), closure=str(i))


@pytest.mark.parametrize("fields", [False, True], ids=["content", "fields"])
def test_what_members_send_fits_the_acceptors_limit(fields: bool) -> None:
    """A non-seed's forward (cluster/forwarding.py) of the largest publishes, taken as
    the forwarder takes them, and the batch of a seed's command of them: each frame fits
    the limit; counting the content alone (as before), a command of publishes with
    large fields held all 40 of them: a 4.4 MB frame for every follower (200: 22 MB)."""
    limit = accepted_frame_limit(DEFAULT_MAX_FRAME_SIZE)
    publishing = new_publishing()
    for i in range(40):
        publishing.submit(largest_publish(i, fields=fields), None, 0.0)
    coordinator = Coordinator()
    taken = 0
    while requests := publishing.take_outgoing(FORWARD_BYTES):
        forward = link.encode_frame(link.Forward(tuple(requests)))
        assert len(forward) - 4 <= limit
        batch = link.encode_frame(link.Batch(coordinator.apply_batch(7, requests)))
        assert len(batch) - 4 <= limit
        taken += len(requests)
    assert taken == 40
    assert MAX_COMMAND_BYTES <= FORWARD_BYTES  # a seed's own command: the same bound


def largest(i: int, size: int, *, fields: bool, epoch: int = 0, seq: int = 0) -> Message:
    """A message of ``size`` (Message.size) by content, or by one-character fields and
    values (the most CBOR for its size), with a 1,000-character closure."""
    if not fields:
        return Message(f"/big/{i}", bytes(size), closure="c" * 1000, epoch=epoch, seq=seq)
    names = [f"{n:x}" for n in range(size // 8)]
    return Message(f"/big/{i}", b"", fields=dict.fromkeys(names, "v"), closure="c" * 1000,
                   epoch=epoch, seq=seq)


@pytest.mark.parametrize(("max_frame_size", "fields"), [
    (DEFAULT_MAX_FRAME_SIZE, False), (DEFAULT_MAX_FRAME_SIZE, True), (4 << 20, False),
    (LINKED_MAX_FRAME_SIZE, False),
], ids=["1MiB-content", "1MiB-fields", "4MiB-content", "largest-linked-content"])
def test_what_a_seed_sends_fits_the_connectors_limit(max_frame_size: int, fields: bool) -> None:
    """The batches of a seed's commands (taken as a seed takes them: MAX_COMMAND_BYTES,
    one publish always), the batch of a forward as an acceptor takes it, and the parts
    of a cache sync (MAX_FRAME / PART_SHARE, a snapshot and one message always) of the
    largest messages MaxFrameSize lets in (MaxMessageSize just below it): each frame fits
    connected_frame_limit, which is below MAX_FRAME (the connectors' limit before)."""
    limit = connected_frame_limit(max_frame_size)
    assert limit <= link.MAX_FRAME
    size = max_frame_size - 1024  # the largest MaxMessageSize this MaxFrameSize allows
    publishing = new_publishing()
    for i in range(4):
        publishing.submit(largest(i, size, fields=fields), None, 0.0)
    coordinator = Coordinator()
    frames = []
    for budget in (MAX_COMMAND_BYTES, FORWARD_BYTES):
        while requests := publishing.take_outgoing(budget):
            frames.append(link.encode_frame(link.Batch(coordinator.apply_batch(7, requests))))
        for i in range(4):
            publishing.submit(largest(i, size // 3, fields=fields), None, 0.0)
    records = [SubjectSync(f"/big/{i}", 7, 3, largest(i, size, fields=fields, epoch=7, seq=2),
                           tuple(largest(i, size, fields=fields, epoch=7, seq=s)
                                 for s in (1, 2, 3)))
               for i in range(2)]
    frames += link.sync_frames(CacheSync(9, tuple(records)))
    assert len(frames) > 4
    assert max(len(f) - 4 for f in frames) <= limit


LINKED = {"ClusterMembers": "127.0.0.1:9100, 127.0.0.1:9110, 127.0.0.1:9120",
          "ClusterMemberListen": "127.0.0.1:9110", "ClusterPassword": "s3cret-s3cret"}


@pytest.mark.parametrize("linked", [LINKED, {"Workers": "2"}], ids=["cluster", "workers"])
def test_a_max_frame_size_whose_publishes_a_link_frame_cannot_hold_is_refused(
    linked: dict[str, str],
) -> None:
    """The connector's limit holds 1 MiB + 4 x MaxFrameSize + 64 KiB, capped at MAX_FRAME
    (64 MiB), the most the link encodes: above LINKED_MAX_FRAME_SIZE (15.7 MiB) it was
    capped and what it reserves no longer held. Before, a cluster (or Workers > 1) took
    MaxFrameSize 33 MiB with MaxMessageSize 1 KiB below it, and a cache sync part of a
    subject's snapshot and one cached message that large (69,206,036 bytes) could not
    be sent at all (``LinkError: frame of 69206036 bytes exceeds MAX_FRAME``); the
    config is refused now, in one line naming the keys. LINKED_MAX_FRAME_SIZE is the
    largest MaxFrameSize whose limit is not capped."""
    assert LINKED_MAX_FRAME_SIZE > 15 << 20
    body_and_slack = connected_frame_limit(0)
    assert body_and_slack + 4 * LINKED_MAX_FRAME_SIZE <= link.MAX_FRAME
    assert body_and_slack + 4 * (LINKED_MAX_FRAME_SIZE + 1) > link.MAX_FRAME

    def sizes(largest: int, linked: dict[str, str] = linked) -> dict[str, str]:
        return {**linked, "MaxFrameSize": str(largest), "MaxMessageSize": str(largest - 1024),
                "ClientMaxPendingBytes": str(2 * largest)}

    taken = load_config(overrides=sizes(LINKED_MAX_FRAME_SIZE), environ={})
    assert taken.max_frame_size == LINKED_MAX_FRAME_SIZE
    for size in (LINKED_MAX_FRAME_SIZE + 1, 33 << 20):
        with pytest.raises(ConfigError) as refused:
            load_config(overrides=sizes(size), environ={})
        said = str(refused.value)
        assert "MaxFrameSize" in said and str(size) in said and "\n" not in said
        assert ("ClusterMembers" if linked is LINKED else "Workers") in said
    alone = load_config(overrides=sizes(33 << 20, {}), environ={})  # one process: no link
    assert alone.max_frame_size == 33 << 20


def test_a_single_request_larger_than_the_budget_is_still_taken() -> None:
    publishing = new_publishing()
    publishing.submit(Message("/a/b", bytes(FORWARD_BYTES * 2)), None, 0.0)
    publishing.submit(Message("/a/b", b"x"), None, 0.0)
    assert [r.ref for r in publishing.take_outgoing(FORWARD_BYTES)] == [1]
    assert [r.ref for r in publishing.take_outgoing(FORWARD_BYTES)] == [2]


# --- the versioned handshake's decoders, fuzzed -------------------------------------------

fuzz = settings(max_examples=200, deadline=None)
versions = st.integers(1, 5)


def handshake_bytes(acceptor_version: int, connector_version: int) -> tuple[bytes, bytes]:
    """The challenge an acceptor sends, and the auth a connector of the same version as
    the acceptor answers it with."""
    acceptor = LinkConnection(role="accept", member=ACCEPTOR, password=PASSWORD,
                              version=acceptor_version, nonce_source=lambda n: bytes(n))
    challenge = acceptor.initiate()
    connector = LinkConnection(role="connect", member=CONNECTOR, password=PASSWORD,
                               version=connector_version, nonce_source=lambda n: b"\x01" * n)
    connector.initiate()
    connector.receive_data(challenge)
    try:
        (auth,) = drain(connector)
        return challenge, auth.data
    except VersionMismatch:
        body = {"t": "auth", "m": CONNECTOR, "n": b"\x01" * 16, "mac": bytes(32),
                "v": connector_version}
        return challenge, frame(body)


def outcome(role: Any, version: int, chunks: list[bytes]) -> list[Any]:
    c = LinkConnection(role=role, member=ACCEPTOR if role == "accept" else CONNECTOR,
                       password=PASSWORD, version=version, nonce_source=lambda n: bytes(n))
    c.initiate()
    seen: list[Any] = []
    try:
        for chunk in chunks:
            c.receive_data(chunk)
            while (event := c.next_event()) is not None:
                seen.append(type(event).__name__ if isinstance(event, Outgoing) else event)
    except LinkError as exc:
        seen.append((type(exc).__name__, exc.reason))
    return seen


@fuzz
@given(versions, versions, st.binary(max_size=40))
def test_challenges_whole_bytewise_and_with_trailing_bytes(
    theirs: int, mine: int, trailing: bytes
) -> None:
    challenge, _ = handshake_bytes(theirs, mine)
    whole = outcome("connect", mine, [challenge])
    assert outcome("connect", mine, [bytes([b]) for b in challenge]) == whole
    assert outcome("connect", mine, [challenge + trailing])[: len(whole)] == whole
    assert (whole == ["Outgoing"]) == (theirs == mine)
    if theirs != mine:
        assert whole[0][0] == "VersionMismatch"


@fuzz
@given(versions, versions, st.binary(max_size=40))
def test_auths_whole_bytewise_and_with_trailing_bytes(
    theirs: int, mine: int, trailing: bytes
) -> None:
    _, auth = handshake_bytes(mine, theirs)
    whole = outcome("accept", mine, [auth])
    assert outcome("accept", mine, [bytes([b]) for b in auth]) == whole
    assert outcome("accept", mine, [auth + trailing])[: len(whole)] == whole
    if theirs == mine:
        assert whole == ["Outgoing", Authenticated(CONNECTOR)]
    else:
        assert whole[0][0] == "VersionMismatch"


@fuzz
@given(st.sampled_from(["challenge", "auth"]), st.data())
def test_any_version_value_gives_a_link_error_or_a_link(tag: str, data: st.DataObject) -> None:
    value = data.draw(st.one_of(st.integers(-(2**65), 2**65), st.text(max_size=3),
                                st.none(), st.booleans(), st.binary(max_size=3)))
    if tag == "challenge":
        body = {"t": "challenge", "n": bytes(16), "m": ACCEPTOR, "v": value}
        role: Any = "connect"
    else:
        body = {"t": "auth", "m": CONNECTOR, "n": bytes(16), "mac": bytes(32), "v": value}
        role = "accept"
    seen = outcome(role, LINK_VERSION, [struct.pack(">I", len(cbor2.dumps(body)))
                                        + cbor2.dumps(body)])
    assert seen and (seen[0] == "Outgoing" or seen[-1][0] in {"LinkError", "VersionMismatch"})


def test_a_heartbeat_after_a_versioned_handshake() -> None:
    acceptor = LinkConnection(role="accept", member=ACCEPTOR, password=PASSWORD, version=2)
    connector = LinkConnection(role="connect", member=CONNECTOR, password=PASSWORD, version=2)
    acceptor._pending_challenge = acceptor.initiate()  # type: ignore[attr-defined]
    connector.initiate()
    handshake(acceptor, connector)
    connector.receive_data(acceptor.send(Heartbeat(5)))
    assert drain(connector) == [Heartbeat(5)]
