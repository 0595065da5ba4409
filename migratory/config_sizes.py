"""Rules between the size keys: what a client may send, what a message may be, and
what may wait for a client that reads slowly."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from migratory.config_values import ConfigError
from migratory.protocol.mqtt import MAX_REMAINING_LENGTH

if TYPE_CHECKING:
    from migratory.config_fields import ConfigFields

MAX_MESSAGE_SIZE = MAX_REMAINING_LENGTH - 3
"""``MaxMessageSize`` at most: the largest message an MQTT PUBLISH can carry -- its
remaining length is the topic (the subject less its slash) with its 2-byte length, a
2-byte packet id and the content: at most 3 bytes past the message's size. A larger
message was numbered, then its MQTT encoding raised in the hub, after its position was
taken (a subject's whole fan-out cut at that message)."""

LINKED_MAX_FRAME_SIZE = ((64 << 20) - (1 << 20) - (64 << 10)) // 4
"""``MaxFrameSize`` at most in a cluster or with ``Workers`` > 1 (16,498,688 bytes,
15.7 MiB): a member (a worker) dialling another takes link frames of 1 MiB + 4 x
``MaxFrameSize`` + 64 KiB -- a committed batch or a cache sync part with two of the
largest publishes, each counted at twice a client frame -- and a link frame is at most
64 MiB (``cluster.link_limits.connected_frame_limit``, ``MAX_FRAME``; the cluster's
tests pin this figure to them). Above it the limit was capped and what it reserves no
longer held: with ``MaxMessageSize`` near it, a cache sync part of a subject's snapshot
and one cached message (33 MiB each: 69,206,036 bytes) could not be sent at all."""

PENDING_MESSAGES = 2
"""``ClientMaxPendingBytes`` holds at least this many of the largest message: one such
message, encoded (SSE sends binary content in base64, 4/3 of it, with its fields as
JSON), must fit in what a client may have waiting, or every client it is delivered to is
cut off as a slow consumer -- and, resuming, cut again at the same message, for ever."""


def check_sizes(config: ConfigFields, key: Callable[[str], str]) -> None:
    if config.max_frame_size <= config.max_message_size:
        raise ConfigError(
            f"{key('MaxFrameSize')} ({config.max_frame_size}) must be larger than "
            f"{key('MaxMessageSize')} ({config.max_message_size})"
        )
    if config.client_max_pending_bytes < PENDING_MESSAGES * config.max_message_size:
        raise ConfigError(
            f"{key('ClientMaxPendingBytes')} ({config.client_max_pending_bytes}) must be at "
            f"least {PENDING_MESSAGES} x {key('MaxMessageSize')} ({config.max_message_size}): "
            "a message that large would cut off every client it is delivered to, at every "
            "resume"
        )
    linked = (f"{key('ClusterMembers')} set" if config.clustered
              else f"{key('Workers')} = {config.workers}" if config.workers > 1 else None)
    if linked is not None and config.max_frame_size > LINKED_MAX_FRAME_SIZE:
        raise ConfigError(
            f"{key('MaxFrameSize')} ({config.max_frame_size}) is above "
            f"{LINKED_MAX_FRAME_SIZE}, the most with {linked}: a link frame between "
            "members (workers) is at most 64 MiB and must hold 1 MiB and two of the "
            "largest publishes at 2 x MaxFrameSize each (docs/cluster.md, Bounds)"
        )
