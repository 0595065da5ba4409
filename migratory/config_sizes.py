"""Rules between the size keys: what a client may send, what a message may be, and
what may wait for a client that reads slowly."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from migratory.config_values import ConfigError
from migratory.protocol.mqtt import MAX_REMAINING_LENGTH

if TYPE_CHECKING:
    from migratory.config import Config

MAX_MESSAGE_SIZE = MAX_REMAINING_LENGTH - 3
"""``MaxMessageSize`` at most: the largest message an MQTT PUBLISH can carry -- its
remaining length is the topic (the subject less its slash) with its 2-byte length, a
2-byte packet id and the content: at most 3 bytes past the message's size. A larger
message was numbered, then its MQTT encoding raised in the hub, after its position was
taken (a subject's whole fan-out cut at that message)."""

PENDING_MESSAGES = 2
"""``ClientMaxPendingBytes`` holds at least this many of the largest message: one such
message, encoded (SSE sends binary content in base64, 4/3 of it, with its fields as
JSON), must fit in what a client may have waiting, or every client it is delivered to is
cut off as a slow consumer -- and, resuming, cut again at the same message, for ever."""


def check_sizes(config: Config, key: Callable[[str], str]) -> None:
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
