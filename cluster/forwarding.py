"""Forwarding: the publishes a member takes from its clients, on their way to Raft.

Every member queues its clients' publishes in :class:`~cluster.publishing.ClusterPublishing`.
:class:`Outgoing` hands them out in batches (a short linger lets one Raft command carry
many); a seed submits them itself (:mod:`cluster.seed`), a non-seed forwards them to
its upstream seed (:func:`forward_to`), which submits them and answers only failures
(``ForwardFailed``) -- successes are acknowledged from the committed stream.
"""

from __future__ import annotations

import trio

from cluster import link
from cluster.coordination import PublishRequest
from cluster.link_io import LinkChannel
from cluster.publishing import ClusterPublishing

SUBMIT_LINGER = 0.001
"""Seconds a non-seed's publishes wait to share one forward (a seed does not linger: its
commit window groups them, :mod:`cluster.commit_window`)."""


class Outgoing:
    """The publishes waiting to be submitted, handed out in batches."""

    def __init__(self, publishing: ClusterPublishing) -> None:
        self.publishing = publishing
        self._wake = trio.Event()
        publishing.on_outgoing = self._wake.set

    async def wait(self) -> None:
        """Until at least one publish is queued (at once if one is)."""
        while not self.publishing.outgoing:
            await self._wake.wait()
            if not self.publishing.outgoing:  # a wake-up for publishes already taken
                self._wake = trio.Event()
                self.publishing.on_outgoing = self._wake.set

    async def next_requests(
        self, linger: float = SUBMIT_LINGER, max_bytes: int | None = None
    ) -> list[PublishRequest]:
        """The publishes taken since the last call, after ``linger`` seconds (``0``: take
        what is queued at once), at most ``max_bytes`` of content (always one).

        Publishes already queued are taken without waiting for a wake-up: the wake-up
        comes only with the first publish into an empty queue, and a caller cancelled
        while lingering (its link ended) leaves them queued for the next caller."""
        while True:
            await self.wait()
            self._wake = trio.Event()
            self.publishing.on_outgoing = self._wake.set
            if linger > 0:
                await trio.sleep(linger)
            requests = self.publishing.take_outgoing(max_bytes)
            if requests:
                return requests


async def forward_to(
    channel: LinkChannel, outgoing: Outgoing, linger: float = SUBMIT_LINGER
) -> None:
    """A non-seed's publishes to its upstream seed, for as long as the link lasts
    (``linger``: see :meth:`Outgoing.next_requests`; a worker's local link uses 0).

    Requests taken but not written when the link fails are not lost for the client:
    their outcome is unknown and the publishing timeout reports it (never a false OK).

    A forward carries at most :data:`~cluster.link.FORWARD_BYTES` (one request always):
    taking every queued publish into one frame, a queue of more than ``MAX_FRAME``
    (publishes held while the link was down, a burst of large ones) could not be encoded;
    the link ended, the next one resent them all in one frame again, and so on.
    """
    while True:
        requests = await outgoing.next_requests(linger, link.FORWARD_BYTES)
        await channel.send(link.Forward(tuple(requests)))
