"""A command a follower seed cannot forward to the leader fails at once.

A follower seed hands each command (a batch of publishes, an MQTT session save) to
the Raft leader over its link. pysyncobj 0.3.17 (``SyncObj._checkCommandsToApply``)
sends it with ``transport.send`` and ignores the ``False`` that says the link to the
leader is down: the command is dropped, and its callback waits for an answer that
never comes -- until the next leader change (``LEADER_CHANGED``, an unknown outcome),
or the publish timeout reports "outcome unknown" (10 s later, seen by the soak of
benchmarks/soak.py). A command never sent cannot commit: here it gets
``REQUEST_DENIED`` (a definite refusal: ``PUBLISH_FAILED`` at once) when the link to
the leader is not connected before the send. A send that fails *after* writing keeps
pysyncobj's behaviour: the leader may have read the command, so its outcome is unknown.
"""

from __future__ import annotations

from typing import Any

from pysyncobj import FAIL_REASON, SyncObj
from pysyncobj.tcp_connection import CONNECTION_STATE

__all__ = ["ForwardedCommandsFailFast", "link_up"]


def link_up(transport: Any, node: Any) -> bool:
    """Whether pysyncobj's TCP transport has a connected link to ``node`` (what its
    ``send`` checks before it writes)."""
    connection = transport._connections.get(node)
    return connection is not None and connection.state == CONNECTION_STATE.CONNECTED


class ForwardedCommandsFailFast(SyncObj):  # type: ignore[misc]
    """A ``SyncObj`` whose follower refuses, at once, a command it cannot forward."""

    _SyncObj__transport: Any
    _SyncObj__commandsWaitingReply: dict[Any, Any]

    def _checkCommandsToApply(self) -> None:
        transport = self._SyncObj__transport
        send = transport.send

        def forward(node: Any, message: Any) -> bool:
            if (
                isinstance(message, dict)
                and message.get("type") == "apply_command"
                and not link_up(transport, node)
            ):
                waiting = self._SyncObj__commandsWaitingReply
                callback = waiting.pop(message.get("request_id"), None)
                if callback is not None:
                    callback(None, FAIL_REASON.REQUEST_DENIED)
                return False
            return bool(send(node, message))

        transport.send = forward  # this call only: the transport's own method after it
        try:
            super()._checkCommandsToApply()
        finally:
            del transport.send
