"""The publishes a member takes from a peer over the cluster link, checked as a client's.

A client's publish is checked where it comes in (``migratory/server/publish_rules.py``);
over the link, a non-seed's ``Forward`` to a seed and a Standard member's
``StandardPublish`` were taken as they came: a peer with the ClusterPassword (or a
member of another version, or configured with a larger ``MaxMessageSize``) had invalid
subjects and oversized messages numbered and fanned out -- a subject of 70,000 bytes
made the hub raise in an MQTT ``#`` subscriber's delivery, on every member. Now each
publish passes :func:`~migratory.server.publish_rules.message_refusal`, the same
function a client's publish passes (``member=True``: a member's own ``/$`` records are
its server's). A refused one is:

- answered to its origin (a forward: ``ForwardFailed`` naming it and its status, so the
  client of that member gets that status -- ``MESSAGE_SIZE_LIMIT_EXCEEDED`` for a message
  past this member's MaxMessageSize, ``PUBLISH_FAILED`` otherwise -- with the reason,
  once); the valid publishes of the same
  forward are submitted as if it had come alone;
- counted by status (``migratory_cluster_link_publishes_refused_total{status}``);
- logged at warning once a minute per peer and status (a flood stays readable);
- not a reason to end the link (its other publishes, its replication, go on).

What the sender set of the server's own (epoch, seq, type, closure) is not checked: it
is not kept, both numberings build a new message (``Coordinator._number``,
``Hub.publish``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from cluster import link
from cluster.agreement import Repeats
from cluster.coordination import PublishRequest
from migratory.config import SETTINGS
from migratory.model.message import Message
from migratory.protocol import ops
from migratory.server.publish_rules import message_refusal

log = logging.getLogger("migratory.cluster")

DEFAULT_MAX_MESSAGE_SIZE = int(next(s.default for s in SETTINGS if s.key == "MaxMessageSize"))

REFUSAL_STATUSES = (ops.Status.PUBLISH_FAILED, ops.Status.MESSAGE_SIZE_LIMIT_EXCEEDED)
"""The labels of ``migratory_cluster_link_publishes_refused_total``: an invalid subject,
a message past MaxMessageSize (a member's ``/$`` publish is its server's: taken)."""


@dataclass
class PeerPublishes:
    """One member's check of its peers' publishes, with its counts and its log."""

    max_message_size: int
    refused: dict[str, int] = field(
        default_factory=lambda: {status.value: 0 for status in REFUSAL_STATUSES})
    """status -> publishes refused (all peers)."""
    repeats: Repeats = field(default_factory=Repeats)

    def refusal(self, peer: str, message: Message, now: float) -> str | None:
        """Why ``peer``'s ``message`` is refused (``STATUS: reason``), or None; counted and
        logged (once a minute per peer and status)."""
        refused = self.refused_with(peer, message, now)
        return None if refused is None else f"{refused[0].value}: {refused[1]}"

    def refused_with(
        self, peer: str, message: Message, now: float
    ) -> tuple[ops.Status, str] | None:
        """The status and reason ``peer``'s ``message`` is refused with, or None; counted
        and logged (once a minute per peer and status)."""
        refused = message_refusal(message, self.max_message_size, member=True)
        if refused is None:
            return None
        status, reason = refused
        self.refused[status.value] = self.refused.get(status.value, 0) + 1
        if self.repeats.first(peer, status.value, now):
            log.warning(
                "refused a publish from member %s on subject %r: %s (%s); its link stays "
                "up; more of this kind from it are counted "
                "(migratory_cluster_link_publishes_refused_total), logged again in %.0f s",
                peer, message.subject[:80], reason, status.value, self.repeats.every)
        return status, reason

    def forward(
        self, peer: str, requests: Sequence[PublishRequest], now: float
    ) -> tuple[list[PublishRequest], list[link.ForwardFailed]]:
        """``peer``'s forward split: the publishes to submit, and the answers to send it
        for the others (one ``ForwardFailed`` per status and reason, carrying the status
        its publishers are answered)."""
        taken: list[PublishRequest] = []
        failed: dict[tuple[ops.Status, str], list[tuple[str, int]]] = {}
        for request in requests:
            refused = self.refused_with(peer, request.message, now)
            if refused is None:
                taken.append(request)
            else:
                failed.setdefault(refused, []).append((request.origin, request.ref))
        return taken, [link.ForwardFailed(tuple(origins), f"{status.value}: {reason}", False,
                                          status)
                       for (status, reason), origins in failed.items()]
