"""What every front end checks before a publish goes to the publishing path."""

from __future__ import annotations

from collections.abc import Mapping

from migratory.entitlement_decisions import ClientIdentity
from migratory.listeners import PUBLISH_REFUSED_REASON, Listener
from migratory.model.message import Message
from migratory.model.snapshot import merged_size
from migratory.model.subject import InvalidSubjectError, reserved, validate_subject
from migratory.protocol import ops
from migratory.server.admission import address_allowed
from migratory.server.context import ServerContext


def message_refusal(
    message: Message, max_message_size: int, *, member: bool = False
) -> tuple[ops.Status, str] | None:
    """``(status, reason)`` refusing ``message`` for what it is, or None: its subject
    (the syntax; a ``/$...`` subject is the server's), its size (``MaxMessageSize``).

    The one check of a message wherever it comes in: a client's publish
    (:func:`check_publish`) and a peer member's over the cluster link (a non-seed's
    forward to a seed, a Standard member's publish: ``cluster/link_publishes.py``), where
    before anything a member with the ClusterPassword sent was numbered and fanned out
    (a 70,000-byte subject made an MQTT ``#`` subscriber's delivery raise in the hub).
    A field name or value that UTF-8 cannot encode (a lone surrogate: JSON's
    ``"\\ud800"`` in a ``POST /publish``) is refused too: numbered, it raised in the
    hub's encoding after its position was taken -- never delivered to SSE and MQTT
    subscribers (a silent gap), and every native subscriber of the subject closed with
    1011 at each resume, for as long as the cache or the snapshot held it.
    ``member``: a peer's publish, which may be on a ``/$`` subject (its server's MQTT
    session records and load reports, written as a client's publish is) and then is
    bounded by the link's frame, not ``MaxMessageSize`` (a session record is not).
    """
    try:
        validate_subject(message.subject)
    except InvalidSubjectError as exc:
        return ops.Status.PUBLISH_FAILED, exc.reason
    unencodable = _unencodable_field(message.fields)
    if unencodable is not None:
        return ops.Status.PUBLISH_FAILED, (
            f"field {unencodable!r} is not encodable as UTF-8 (contains a lone surrogate)")
    refusal = reserved(message.subject)  # /$mqtt-session/, /$migratory/load/
    if refusal is not None:
        if not member:
            return ops.Status.PUBLISH_DENIED, refusal
        return None
    if message.size() > max_message_size:
        return (
            ops.Status.MESSAGE_SIZE_LIMIT_EXCEEDED,
            f"message is {message.size()} bytes, MaxMessageSize is {max_message_size}",
        )
    return None


def _unencodable_field(fields: Mapping[str, str] | None) -> str | None:
    """The first field name or value UTF-8 cannot encode, or None (ASCII is not looked
    at twice: the usual fields cost one ``isascii`` each)."""
    for text in (fields or {}).items():
        for part in text:
            if not part.isascii():
                try:
                    part.encode("utf-8")
                except UnicodeEncodeError:
                    return part
    return None


def check_publish(
    ctx: ServerContext, listener: Listener, identity: ClientIdentity, message: Message
) -> tuple[ops.Status | None, str | None]:
    """``(status, reason)`` refusing ``message``, or ``(None, None)`` to go ahead.

    In order: the listener's role, :func:`message_refusal` (the subject, the size), the
    size of the merged snapshot a retained message makes,
    PublishAllowFromAddressList, entitlement, MaxSubjects (for a subject new here).
    """
    if not listener.publish:
        return ops.Status.PUBLISH_DENIED, PUBLISH_REFUSED_REASON
    refusal = message_refusal(message, ctx.config.max_message_size)
    if refusal is not None:
        return refusal
    limit = ctx.config.max_message_size
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
