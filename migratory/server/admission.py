"""What a session checks before it does work a client asks for: bound, then work.

Sans-I/O helpers of :mod:`migratory.server.session`: the answer-size check of a
``subscribe`` (refused before anything is encoded), the per-connection publish rate,
and ``PublishAllowFromAddressList``. docs/security.md lists every limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from ipaddress import IPv4Network, IPv6Network, ip_address
from typing import TYPE_CHECKING

from migratory.model.outbox import Outbox
from migratory.protocol import close_codes, ops
from migratory.protocol.ops import SUBSCRIBE_TOO_LARGE
from migratory.server.hub import Hub

if TYPE_CHECKING:
    from migratory.server.context import ServerContext

STATUS_OVERHEAD = 64
"""Bytes of one ``status`` answer besides its subject (CBOR keys, position, frame)."""


WORK_UNIT_BYTES = 16_384
"""A subscribe's answer counts one operation per this many bytes of its messages'
contents, against the operations a connection may have processed per loop turn
(``session_subscriptions.answer_units``)."""


def subscribe_answer_bytes(hub: Hub, requests: Sequence[ops.SubscriptionRequest]) -> int:
    """An upper bound of the bytes answering ``requests`` takes, in O(len(requests))."""
    total = 0
    for request in requests:
        total += STATUS_OVERHEAD * 2 + len(request.subject) * 2 + hub.answer_bytes(request)
    return total


def subscribe_refusal(
    hub: Hub, requests: Sequence[ops.SubscriptionRequest], room: int
) -> str | None:
    """Why the whole subscribe is refused (its answer would not fit in ``room`` bytes of
    the client's outbox), or None."""
    needed = subscribe_answer_bytes(hub, requests)
    if needed <= room:
        return None
    return (
        f"{SUBSCRIBE_TOO_LARGE}: about {needed} bytes, {max(room, 0)} fit in the client's "
        "outbox (ClientMaxPendingBytes); ask for less history or fewer subjects at once"
    )


def refuse_subscribe(
    ctx: ServerContext, outbox: Outbox, requests: Sequence[ops.SubscriptionRequest]
) -> list[ops.SubjectStatus] | None:
    """The ``SUBSCRIBE_DENY`` of every entry when the whole subscribe is refused (its
    answer would not fit in ``outbox``), else None. More entries than
    MaxSubjectsPerSubscribe raise OperationError (close 4000)."""
    limit = ctx.config.max_subjects_per_subscribe
    if len(requests) > limit:
        raise ops.OperationError(
            close_codes.BAD_OPERATION,
            f"subscribe: {len(requests)} entries, MaxSubjectsPerSubscribe is {limit}",
        )
    refusal = subscribe_refusal(ctx.hub, requests, outbox.max_pending - outbox.pending_bytes)
    if refusal is None:
        return None
    ctx.stats.subscribes_refused += 1
    return [  # the reason in full once
        ops.SubjectStatus(
            ops.Status.SUBSCRIBE_DENY, r.subject, reason=SUBSCRIBE_TOO_LARGE if n else refusal
        )
        for n, r in enumerate(requests)
    ]


def subscription_limit(
    ctx: ServerContext, subjects: AbstractSet[str], subject: str
) -> str | None:
    """Why a client holding ``subjects`` may not add ``subject`` (a limit), or None;
    counted in ``subscriptions_refused`` by limit."""
    if subject in subjects:
        return None
    config = ctx.config
    if len(subjects) >= config.max_subscriptions_per_connection:
        ctx.stats.count(ctx.stats.subscriptions_refused, "MaxSubscriptionsPerConnection")
        return f"MaxSubscriptionsPerConnection ({config.max_subscriptions_per_connection}) reached"
    return total_subscriptions_limit(ctx, 1)


def total_subscriptions_limit(ctx: ServerContext, more: int) -> str | None:
    """Why ``more`` subscriptions would pass MaxSubscriptions (every client's, whatever
    its protocol), or None; counted in ``subscriptions_refused``."""
    limit, stats = ctx.config.max_subscriptions, ctx.stats
    if limit and stats.subscriptions_open + more > limit:
        stats.count(stats.subscriptions_refused, "MaxSubscriptions")
        return f"MaxSubscriptions ({limit}) reached"
    return None


class PublishRate:
    """A token bucket: ``rate`` publishes per second, bursts of one second's worth."""

    __slots__ = ("_last", "_rate", "_tokens")

    def __init__(self, rate: int, now: float) -> None:
        self._rate = rate
        self._tokens = float(rate)
        self._last = now

    def take(self, now: float) -> bool:
        """Whether one more publish is allowed at ``now`` (0: no limit)."""
        if not self._rate:
            return True
        rate = self._rate
        tokens = self._tokens + (now - self._last) * rate
        if tokens > rate:
            tokens = float(rate)
        self._last = now
        if tokens < 1.0:
            self._tokens = tokens
            return False
        self._tokens = tokens - 1.0
        return True


def address_allowed(networks: Sequence[IPv4Network | IPv6Network], peer: str) -> bool:
    """Whether ``peer`` (``host:port``) is in one of ``networks`` (empty: any address)."""
    if not networks:
        return True
    host = peer.rsplit(":", 1)[0].strip("[]")
    try:
        address = ip_address(host)
    except ValueError:
        return False
    return any(address in network for network in networks)
