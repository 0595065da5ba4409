"""What a seed tells the publishers of a batch that Raft did not commit. Pure.

Raft refuses a batch for sure (it was never appended), or cannot say (its leader
changed with the batch in flight): then the batch may still commit. A definite
refusal fails the publishes at once (``PUBLISH_FAILED``, or ``ForwardFailed`` to the
non-seed that forwarded them). An unknown outcome keeps them waiting, and the seed
submits a barrier (an empty batch): once the barrier commits, every batch appended
before it has been applied, so what is still pending never commits -- provided this
seed passed every batch before the barrier on: it is whole (it applied them all, its
followers got them or a sync). Otherwise the outcome stays unknown and the publish
timeout reports it; never a definite failure for a publish that committed.
"""

from __future__ import annotations

from cluster import link
from cluster.stream import CommittedStream

Origins = list[tuple[str, int]]

__all__ = ["CLOSED_NAME", "STARTING_NAME", "barrier_committed", "fail", "raft_failed"]

CLOSED_NAME = "RAFT_STOPPED"
"""A submit to a Raft node that stopped (a file it could not write: cluster/raft_disk.py)
or that the member closed: definite, the command was never sent."""
STARTING_NAME = "RAFT_STARTING"
"""A forward to a seed whose Raft node is not built yet (it waits for the other seeds'
agreement, or loads its log): never submitted either."""
_NOT_HERE = {CLOSED_NAME: "stopped", STARTING_NAME: "is starting"}


def fail(
    stream: CommittedStream, origins: Origins, reason: str, *, reply_to: str | None, now: float
) -> None:
    """Definite failure of whatever of ``origins`` is still pending: this member's own
    publishes (``reply_to`` None), or those the non-seed ``reply_to`` forwarded."""
    if reply_to is None:
        stream.publishing.on_failed(origins, reason, unknown=False, now=now)
    else:
        stream.send_to(reply_to, link.ForwardFailed(tuple(origins), reason, False))


def raft_failed(
    stream: CommittedStream,
    origins: Origins,
    error: str,
    *,
    unknown: bool,
    reply_to: str | None,
    now: float,
) -> bool:
    """Raft failed a batch with ``error``; True when a barrier must settle it.

    A non-seed's forward this seed's Raft node never took (:data:`CLOSED_NAME`,
    :data:`STARTING_NAME`) is not failed: the seed ends that non-seed's link and says
    nothing, and the non-seed forwards it again through another seed, with what it
    forwarded after it, in its order
    (:meth:`~cluster.publishing.ClusterPublishing.resend_unanswered`). Failed, its
    publisher got ``PUBLISH_FAILED`` while a majority of the seeds was up. The seed's
    own publishes its stopped Raft node refused wait too: the seed, leaving, forwards
    them through another seed the same way (``GuaranteedNode._leave_after_raft_stopped``);
    its submits end before its Raft node is closed, so none is refused for that."""
    if error in _NOT_HERE and reply_to is not None:
        stream.end_link(reply_to, f"this seed's Raft node {_NOT_HERE[error]}: its forwards go "
                        "through another seed")
        return False
    if error == CLOSED_NAME:  # (reply_to None: this seed's own)
        return False
    if not unknown:
        fail(stream, origins, error, reply_to=reply_to, now=now)
        return False
    if reply_to is None:
        stream.publishing.on_failed(origins, error, unknown=True, now=now)
    return True


def barrier_committed(
    stream: CommittedStream, origins: Origins, error: str, *, reply_to: str | None, now: float
) -> None:
    """The barrier submitted after ``error`` committed (and this member applied it)."""
    if stream.replica.needs_sync:
        return  # batches before the barrier may not have reached the publishers
    fail(stream, origins, f"the Raft leader changed ({error})", reply_to=reply_to, now=now)
