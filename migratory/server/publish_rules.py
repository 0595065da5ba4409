"""What every front end checks before a publish goes to the publishing path."""

from __future__ import annotations

from migratory.entitlement import ClientIdentity
from migratory.listeners import PUBLISH_REFUSED_REASON, Listener
from migratory.model.message import Message
from migratory.model.snapshot import merged_size
from migratory.model.subject import InvalidSubjectError, reserved, validate_subject
from migratory.protocol import ops
from migratory.server.admission import address_allowed
from migratory.server.context import ServerContext


def check_publish(
    ctx: ServerContext, listener: Listener, identity: ClientIdentity, message: Message
) -> tuple[ops.Status | None, str | None]:
    """``(status, reason)`` refusing ``message``, or ``(None, None)`` to go ahead.

    In order: the listener's role, the subject (``/$...`` ones are the server's),
    the size limit (of the message, and of the merged snapshot a retained one makes),
    PublishAllowFromAddressList, entitlement, MaxSubjects (for a subject new here).
    """
    if not listener.publish:
        return ops.Status.PUBLISH_DENIED, PUBLISH_REFUSED_REASON
    try:
        validate_subject(message.subject)
    except InvalidSubjectError as exc:
        return ops.Status.PUBLISH_FAILED, exc.reason
    refusal = reserved(message.subject)  # /$mqtt-session/, /$migratory/load/
    if refusal is not None:
        return ops.Status.PUBLISH_DENIED, refusal
    limit = ctx.config.max_message_size
    if message.size() > limit:
        return (
            ops.Status.MESSAGE_SIZE_LIMIT_EXCEEDED,
            f"message is {message.size()} bytes, MaxMessageSize is {limit}",
        )
    if message.retained:
        merged = merged_size(ctx.hub.snapshot(message.subject), message)
        if merged > limit:
            return (
                ops.Status.MESSAGE_SIZE_LIMIT_EXCEEDED,
                f"the merged snapshot would be {merged} bytes, MaxMessageSize is {limit}",
            )
    allowed = ctx.config.publish_allow_from_address_list
    if allowed and not address_allowed(allowed, identity.peer):
        return ops.Status.PUBLISH_DENIED, "PublishAllowFromAddressList excludes this address"
    if not ctx.entitlement.allow_publish(identity, message.subject):
        return ops.Status.PUBLISH_DENIED, "not entitled to publish"
    most = ctx.config.max_subjects
    if most and ctx.hub.subject_count >= most and ctx.hub.position(message.subject) is None:
        return ops.Status.PUBLISH_FAILED, f"no new subject: MaxSubjects ({most}) reached"
    return None, None
