"""What a cluster link takes from its peer, and which version of the link it speaks.

Pure (no sockets, no trio): :class:`~cluster.link.LinkConnection` enforces these.

Frame sizes. Whoever has the password can dial, and whoever answers at a member's
address is dialled: 64 MiB (:data:`~cluster.link_ops.MAX_FRAME`) of CBOR decode into
gigabytes of Python objects (8 MiB of empty arrays took 555 MiB), per link. So each
side takes what the other sends at most, derived from the bounds the sender keeps and
``MaxFrameSize`` (what bounds one publish: it came in one client frame, and its CBOR
is at most twice that, for safety: :data:`PUBLISH_FACTOR`):

- an acceptor (:func:`accepted_frame_limit`): forwards of at most :data:`FORWARD_BYTES`
  (one publish always, whatever its size), one Standard publish a frame, small requests;
- a connector -- a non-seed or a worker replicating, a seed asking for a sync, a
  Standard forwarder, the agreement probe -- (:func:`connected_frame_limit`): committed
  batches, each one Raft command (a seed's own of at most :data:`MAX_COMMAND_BYTES`, or
  a forward it submitted as one; one publish always) and cache sync parts of about
  ``MAX_FRAME / PART_SHARE`` (a subject's snapshot and one cached message always).

The connector's limit reaches ``MAX_FRAME`` at ``MaxFrameSize`` 15.7 MiB: a cluster or
``Workers`` > 1 refuses a larger one (``migratory.config_sizes.LINKED_MAX_FRAME_SIZE``;
tests/cluster/test_link_limits.py pins the two together).

Members of one cluster share ``MaxFrameSize`` and ``MaxMessageSize``: a member
configured with less than another would refuse what the other took from its clients
(``frame_size``, counted and logged), so members that differ in either refuse to link
(:func:`cluster.agreement.size_disagreement`). One whose ``MaxFrameSize`` was lowered
below messages still committed or cached refuses them the same way (docs/cluster.md,
"Bounds").

Versions. The handshake's ``challenge`` (acceptor) and ``auth`` (connector) carry the
version of the link protocol their sender speaks as ``"v"``, left out for version 1
(so version 1 is byte for byte the link of members that predate the key), and the MACs
are labelled with it (``migratory-link-<v>|``). A member refuses a peer of another
version in its handshake, saying which versions and what to do (docs/cluster.md,
"Upgrading"), before any operation is parsed.
"""

from __future__ import annotations

from typing import Final

from cluster.link_ops import MAX_FRAME, LinkError
from cluster.link_sync import PART_SHARE

__all__ = [
    "FORWARD_BYTES",
    "FRAME_SLACK",
    "LINK_VERSION",
    "MAX_COMMAND_BYTES",
    "PUBLISH_FACTOR",
    "TLS_PROBE_ALPN",
    "VIOLATION_RULES",
    "FrameTooLarge",
    "LinkViolation",
    "TlsProbe",
    "VersionMismatch",
    "accepted_frame_limit",
    "connected_frame_limit",
    "mac_label",
    "version_refusal",
]

LINK_VERSION: Final = 1
"""The version of the link protocol this member speaks. Raise it with any change an
older member would misread (a frame's layout, a key's meaning); a member speaks one."""

FORWARD_BYTES: Final = 1 << 20
"""What one ``Forward`` carries at most (:func:`~cluster.coordination.request_bytes`;
one request always, whatever its size)."""
MAX_COMMAND_BYTES: Final = 1 << 20
"""Bytes one Raft command carries at most (:mod:`cluster.commit_window`), each publish
counted by :func:`~cluster.coordination.request_bytes` (one publish always fits, whatever
its size): its batch is one link frame to every follower."""
FRAME_SLACK: Final = 64 * 1024
"""Framing of a frame around its requests, at most."""
PUBLISH_FACTOR: Final = 2
"""One publish's CBOR on the link, at most, in client frames of ``MaxFrameSize`` (it is
no larger than the client's encoding of it; twice that, for safety)."""


def accepted_frame_limit(max_frame_size: int) -> int:
    """The largest frame an acceptor takes from the member that dialled it, given
    ``MaxFrameSize``: a ``Forward`` of :data:`FORWARD_BYTES` and one more publish, or
    one Standard publish."""
    return min(MAX_FRAME, FORWARD_BYTES + PUBLISH_FACTOR * max_frame_size + FRAME_SLACK)


def connected_frame_limit(max_frame_size: int) -> int:
    """The largest frame a connector takes from the member it dialled, given
    ``MaxFrameSize``: a committed batch (a command of :data:`MAX_COMMAND_BYTES`, or a
    forward of :data:`FORWARD_BYTES`, and one more publish) or a cache sync part
    (``MAX_FRAME / PART_SHARE``, and a snapshot and a message alone in a part of their
    own: two publishes). 5.06 MiB with the defaults (64 MiB before)."""
    body = max(MAX_COMMAND_BYTES, FORWARD_BYTES, MAX_FRAME // PART_SHARE)
    return min(MAX_FRAME, body + 2 * PUBLISH_FACTOR * max_frame_size + FRAME_SLACK)


VIOLATION_RULES: Final = (
    "frame_size", "frame_stall", "links", "origin", "replicate", "sync_request")
"""The rules a :class:`LinkViolation` names: a frame above the limit, a frame begun and
stalled (cluster/link_io.py ``FRAME_STALL``), more links from one member than
``MAX_LINKS_PER_PEER`` (cluster/link_accept.py), a forward of another member's
publishes, a second ``Replicate`` on one link, a ``SyncRequest`` while a sync is still
queued (cluster/peers.py)."""


class LinkViolation(LinkError):
    """The peer broke one of the link's bounds; ``rule`` names it (the label of
    ``migratory_cluster_link_violations_total``)."""

    def __init__(self, reason: str, rule: str) -> None:
        super().__init__(reason)
        self.rule = rule


class FrameTooLarge(LinkViolation):
    """A frame's length prefix is above the link's limit: refused from its 4 bytes,
    before any of it is buffered."""

    def __init__(self, reason: str, size: int, limit: int) -> None:
        super().__init__(reason, "frame_size")
        self.size = size
        self.limit = limit


TLS_PROBE_ALPN: Final = "migratory-link-tls-probe"
"""The ALPN protocol a member's TLS probe offers (cluster/link_io.py ``speaks_tls``): a
member that heard nothing from a peer asks it, with a bare TLS handshake, whether its
links are TLS. A peer whose links are plain sees a ClientHello where it waits for a
frame; this name in it tells it that the ClientHello is a probe, not a member whose
ClusterTls* keys are set where its own are not."""


class TlsProbe(LinkError):
    """A peer's TLS probe on a plain link: it asked whether this member's links are TLS
    (they are not); nothing is wrong here, and it links again without TLS."""


class VersionMismatch(LinkError):
    """The peer speaks another version of the link protocol."""


def mac_label(version: int, role: bytes) -> bytes:
    """The MAC label of ``role`` (``accept``/``connect``) in ``version``: the label of
    version 1 is the one members before versions used."""
    return b"migratory-link-%d|%s|" % (version, role)


def version_refusal(peer: str, theirs: int, mine: int = LINK_VERSION) -> str:
    """Why a peer of link version ``theirs`` is refused by a member of ``mine``, and
    what to do."""
    order = "upgrade this member too" if theirs > mine else "it must be upgraded too"
    return (f"{peer} speaks cluster link protocol version {theirs}, this member "
            f"{mine}: {order} (docs/cluster.md, Upgrading)")
