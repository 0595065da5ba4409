"""What an MQTT CONNECT is answered with before the entitlement has its say: the
protocol level, the client identifier (one is made up for an empty one with clean
session), the member's readiness and the password as an entitlement token."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from migratory.entitlement_decisions import ClientIdentity
from migratory.protocol import mqtt

MAX_CLIENT_ID_BYTES = 256


@dataclass(frozen=True, slots=True)
class Refusal:
    """A CONNACK return code and why (logged)."""

    code: int
    reason: str


def check_connect(
    packet: mqtt.Connect, peer: str, readiness: Callable[[], str | None]
) -> tuple[str, ClientIdentity] | Refusal:
    """The client id and identity of an acceptable CONNECT, or the refusal."""
    if packet.protocol_name != mqtt.PROTOCOL_NAME or packet.level != mqtt.PROTOCOL_LEVEL:
        return Refusal(mqtt.REFUSED_PROTOCOL_VERSION, "only MQTT 3.1.1 (level 4) is spoken")
    client_id = packet.client_id
    if not client_id:
        if not packet.clean_session:
            return Refusal(mqtt.REFUSED_IDENTIFIER, "an empty client id needs clean session")
        client_id = "migratory-" + os.urandom(8).hex()
    if len(client_id.encode()) > MAX_CLIENT_ID_BYTES:
        return Refusal(mqtt.REFUSED_IDENTIFIER, f"client id over {MAX_CLIENT_ID_BYTES} bytes")
    not_ready = readiness()
    if not_ready is not None:
        return Refusal(mqtt.REFUSED_SERVER_UNAVAILABLE, not_ready)
    try:
        token = None if packet.password is None else packet.password.decode("utf-8")
    except UnicodeDecodeError:
        return Refusal(mqtt.REFUSED_BAD_CREDENTIALS, "the password is not UTF-8")
    name = (packet.username or client_id)[:200]
    return client_id, ClientIdentity(name=name, token=token, peer=peer)
