"""Push monitoring: the meta-subjects under ``/migratory/`` and who may read them.

The server publishes, every ``MonitorPushInterval`` seconds, ``/migratory/stats/<member>``
(its counters and statistics windows) and, on a cluster member, ``/migratory/cluster``
(its view of the cluster). Clients subscribe to them like to any subject, under the
entitlement rules (the seed's PUSH monitoring): the server's entitlement is wrapped so
that only holders of ``MonitorToken`` may subscribe to a meta-subject (none when it is
empty) -- and may connect to do so whatever the Entitlement -- and nobody may publish
one; an MQTT filter whose first level is a wildcard never matches them (model/topic.py
``META_LEVEL``). docs/monitoring.md describes the content (JSON).
"""

from __future__ import annotations

import hmac
import json
import re
from typing import Any

from migratory.entitlement_decisions import ClientIdentity, Entitlement, token_bytes
from migratory.model.message import Message
from migratory.model.topic import META_LEVEL

PREFIX = f"/{META_LEVEL}/"
CLUSTER_SUBJECT = "/migratory/cluster"
FORMAT = 1  # the "format" field of every meta-subject message; bumped on incompatible change

_UNSAFE = re.compile(r"[^A-Za-z0-9._:@-]")


def is_meta_subject(subject: str) -> bool:
    return subject.startswith(PREFIX)


def stats_subject(member: str) -> str:
    """``/migratory/stats/<member>``; characters outside ``[A-Za-z0-9._:@-]`` become ``_``."""
    return f"{PREFIX}stats/{_UNSAFE.sub('_', member) or '_'}"


class MetaSubjectEntitlement:
    """``inner`` for every subject but the meta-subjects: those only holders of
    ``token`` may subscribe to, and nobody may publish."""

    def __init__(self, inner: Entitlement, token: str) -> None:
        self._inner = inner
        self._token = token.encode()
        self.name = inner.name

    def allow_connect(self, client: ClientIdentity) -> bool:
        # the MonitorToken is no JWT and no plugin knows it: its holder (the dashboard)
        # connects whatever the Entitlement, and reads meta-subjects only -- every other
        # subject, and every publish, is still the inner entitlement's
        return self._holds_token(client) or self._inner.allow_connect(client)

    def expiry(self, client: ClientIdentity) -> float | None:
        return self._inner.expiry(client)

    def not_yet_valid(self, client: ClientIdentity) -> float | None:
        return self._inner.not_yet_valid(client)

    def allow_subscribe(self, client: ClientIdentity, subject: str) -> bool:
        if not is_meta_subject(subject):
            return self._inner.allow_subscribe(client, subject)
        return self._holds_token(client)

    def _holds_token(self, client: ClientIdentity) -> bool:
        token = client.token
        return (
            bool(self._token)
            and token is not None
            and hmac.compare_digest(token_bytes(token), self._token)
        )

    def allow_publish(self, client: ClientIdentity, subject: str) -> bool:
        if subject.startswith(PREFIX):  # is_meta_subject, inline: once per publish
            return False
        return self._inner.allow_publish(client, subject)


def meta_message(subject: str, kind: str, member: str, body: dict[str, Any]) -> Message:
    """A retained meta-subject message: JSON content, fields ``kind`` and ``member``."""
    content = {"format": FORMAT, "kind": kind, "member": member, **body}
    return Message(
        subject=subject,
        content=json.dumps(content, sort_keys=True, default=str).encode(),
        fields={"kind": kind, "member": member},
        retained=True,
    )
