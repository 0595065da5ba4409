"""Readiness: whether a member may take clients, and sending them away when it may not.

A member is ready when its copy of the committed stream is whole and current: not
waiting for a cache sync, and -- for a seed -- caught up with Raft and in touch with
a leader, or -- for a non-seed -- caught up with a ready upstream seed that it has
heard from recently. Until then new clients are closed with ``1013`` and
``/readyz`` answers 503 with the reason. A member that was ready and has not been for
:data:`SHED_AFTER` seconds sends its clients away (``1013``) so they resume on a
member that can serve them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

import trio

from cluster.replica import Replica
from migratory.protocol import close_codes

if TYPE_CHECKING:
    from cluster.publishing import ClusterPublishing
    from migratory.server.app import Server

log = logging.getLogger("migratory.cluster")

SHED_AFTER = 3.0
"""Seconds not ready (after having been ready) before clients are sent away."""
BEHIND_SECONDS = 3.0
"""A seed that has not applied what the leader had committed this long ago is not ready:
its clients would see the cluster stand still (a follower catching up a long way).
Here, not in :mod:`cluster.seed_readiness`, because a non-seed's upstream reads it too
(:data:`cluster.upstream.UPSTREAM_BEHIND`), and a non-seed imports no Raft module."""
HOUSEKEEPING_SECONDS = 0.5


class Readiness:
    """The member's readiness, from its replica and its role's own reason."""

    def __init__(
        self,
        replica: Replica,
        role_reason: Callable[[float], str | None],
        *,
        syncing: Callable[[], bool] = lambda: False,
        agreement: Callable[[], str | None] = lambda: None,
        clock: Callable[[], float],
    ) -> None:
        """``agreement``: why the seeds refuse this member (:mod:`cluster.agreement`)."""
        self.replica = replica
        self.role_reason = role_reason
        self.syncing = syncing
        self.agreement = agreement
        self.clock = clock

    def reason(self) -> str | None:
        """Why the member cannot take clients now, or None when it can."""
        disagreed = self.agreement()
        if disagreed is not None:
            return disagreed
        if self.replica.needs_sync or self.syncing():
            return "member is syncing its cache"
        return self.role_reason(self.clock())


class Change(Enum):
    NONE = "none"
    READY = "ready"
    NOT_READY = "not ready"
    SHED = "shed"


@dataclass(slots=True)
class ReadinessWatch:
    """Turns samples of the reason into what to log and when to shed clients. Pure."""

    shed_after: float = SHED_AFTER
    reported: str | None = "starting"
    not_ready_since: float | None = None
    shed: bool = False

    def observe(self, reason: str | None, now: float) -> list[Change]:
        changes: list[Change] = []
        if reason != self.reported:
            changes.append(Change.READY if reason is None else Change.NOT_READY)
        if reason is None:
            self.not_ready_since, self.shed = None, False
        elif self.reported is None:
            self.not_ready_since = now  # was ready: cut off from the cluster
        self.reported = reason
        since = self.not_ready_since
        if not self.shed and since is not None and now - since >= self.shed_after:
            self.shed = True
            changes.append(Change.SHED)
        return changes


async def keep_house(
    who: str,
    publishing: ClusterPublishing,
    readiness: Readiness,
    server: Server,
    *,
    cut_off: str = "member cut off from the cluster",
    sent_to: str = "to other members",
    leaving: Callable[[], bool] = lambda: False,
) -> None:
    """Every :data:`HOUSEKEEPING_SECONDS`: expire stale publish outcomes, log readiness
    changes of ``who`` (a member, a worker), and send its clients away once it has not
    been ready for :data:`SHED_AFTER` seconds -- unless it is ``leaving``: a seed whose
    Raft node stopped is not ready from the stop on, and its leave drains its clients
    once their publishes have their outcomes (up to 5 s: ``cluster/node.py``); shed at
    3 s, they were cut with 1013 and those publishes unanswered (h155)."""
    watch = ReadinessWatch()
    while True:
        await trio.sleep(HOUSEKEEPING_SECONDS)
        now = trio.current_time()
        publishing.expire(now)
        reason = readiness.reason()
        for change in watch.observe(reason, now):
            if change is Change.READY:
                log.info("%s is ready for clients", who)
            elif change is Change.NOT_READY:
                log.warning("%s is not ready: %s", who, reason)
            elif change is Change.SHED and leaving():
                log.info("%s not ready for %g s: leaving, its drain sends its clients away",
                         who, SHED_AFTER)
            elif change is Change.SHED:
                count = server.shed_clients(
                    close_codes.TRY_AGAIN_LATER.code, f"{cut_off}: {reason}"
                )
                log.warning("%s sent %d clients %s (%s)", who, count, sent_to, reason)
