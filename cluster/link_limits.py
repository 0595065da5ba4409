"""What a cluster link takes from its peer, and which version of the link it speaks.

Pure (no sockets, no trio): :class:`~cluster.link.LinkConnection` enforces these.

Frame sizes. A connector (a non-seed, a Standard forwarder, a seed asking for a sync)
takes up to :data:`~cluster.link_ops.MAX_FRAME` (64 MiB) from the member it dialled:
committed batches, some of commands an older member wrote to its Raft log, and cache
sync parts. An acceptor takes much less (:func:`accepted_frame_limit`): the member
that dialled it sends forwards of at most :data:`FORWARD_BYTES`, one Standard publish
per frame, and small requests. Whoever has the password can dial: 64 MiB of CBOR
decode into gigabytes of Python objects (8 MiB of empty arrays took 555 MiB), per link.

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

__all__ = [
    "FORWARD_BYTES",
    "FRAME_SLACK",
    "LINK_VERSION",
    "VIOLATION_RULES",
    "FrameTooLarge",
    "LinkViolation",
    "VersionMismatch",
    "accepted_frame_limit",
    "mac_label",
    "version_refusal",
]

LINK_VERSION: Final = 1
"""The version of the link protocol this member speaks. Raise it with any change an
older member would misread (a frame's layout, a key's meaning); a member speaks one."""

FORWARD_BYTES: Final = 1 << 20
"""What one ``Forward`` carries at most (:func:`~cluster.coordination.request_bytes`;
one request always, whatever its size)."""
FRAME_SLACK: Final = 64 * 1024
"""Framing of a frame around its requests, at most."""


def accepted_frame_limit(max_frame_size: int) -> int:
    """The largest frame an acceptor takes from the member that dialled it, given
    ``MaxFrameSize`` (what bounds one publish: its subject, content, fields and closure
    came in one client frame): a ``Forward`` of :data:`FORWARD_BYTES` and one more
    request (CBOR is no larger than the client's encoding of it; twice that, for
    safety), or one Standard publish."""
    return min(MAX_FRAME, FORWARD_BYTES + 2 * max_frame_size + FRAME_SLACK)


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
