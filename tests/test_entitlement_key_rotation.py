"""Changing the signing key of ``Entitlement = Token`` member by member (docs/security.md,
"Changing the signing key"): every member first gets a JWKS with both keys (chosen by
``kid``), then the issuer signs with the new key, then the old key goes. At no step of
that rollout is a valid token refused -- above all never with the terminal 4003, which
ends an SDK client for good. Signing early, before a member has the new key, is what an
operator must not do: that member refuses every new token with 4003 (pinned here)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec

from migratory.entitlement_decisions import ClientIdentity, connect_refusal
from migratory.entitlement_token import TokenEntitlement, load_keys
from migratory.protocol import close_codes

MEMBERS = 3


def jwks_member(tmp_path: Path, name: str, keys: dict[str, Any]) -> TokenEntitlement:
    """A member started with a JWKS of ``keys`` (kid -> private key: its public half)."""
    jwks = {"keys": [{**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(k.public_key())),
                      "kid": kid} for kid, k in keys.items()]}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(jwks))
    return TokenEntitlement(algorithm="ES256", keys=load_keys("ES256", "", str(path)))


def token(key: Any, kid: str) -> ClientIdentity:
    now = int(time.time())
    claims = {"sub": "alice", "iat": now, "exp": now + 600, "subscribe": ["/a/**"]}
    return ClientIdentity("alice", jwt.encode(claims, key, algorithm="ES256",
                                              headers={"kid": kid}), "127.0.0.1:1")


def test_the_documented_rollout_never_refuses_a_valid_token(tmp_path: Path) -> None:
    old, new = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    both = {"old": old, "new": new}
    old_token, new_token = token(old, "old"), token(new, "new")
    members = [jwks_member(tmp_path, f"m{i}-start", {"old": old}) for i in range(MEMBERS)]
    stages: list[tuple[list[TokenEntitlement], list[ClientIdentity]]] = []
    for i in range(MEMBERS):  # 1. the JWKS with both keys, member by member
        members[i] = jwks_member(tmp_path, f"m{i}-both", both)
        stages.append((list(members), [old_token]))
    stages.append((list(members), [old_token, new_token]))  # 2. the issuer signs with new
    for i in range(MEMBERS):  # 3. old tokens expired: the old key goes, member by member
        members[i] = jwks_member(tmp_path, f"m{i}-new", {"new": new})
        stages.append((list(members), [new_token]))
    for at, (cluster, live) in enumerate(stages):
        for member in cluster:
            for client in live:
                assert member.allow_connect(client), (at, client.token)
                assert member.allow_subscribe(client, "/a/b")
    assert len(stages) == 2 * MEMBERS + 1


def test_signing_with_a_key_some_members_lack_refuses_with_the_terminal_4003(
    tmp_path: Path,
) -> None:
    """What an operator sees when step 2 comes before step 1 is done: the member
    without the new key refuses every new token with 4003 CONNECT_DENIED (terminal);
    the members with both take it."""
    old, new = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    lagging = jwks_member(tmp_path, "lagging", {"old": old})
    ready = jwks_member(tmp_path, "ready", {"old": old, "new": new})
    new_token = token(new, "new")
    assert ready.allow_connect(new_token)
    assert not lagging.allow_connect(new_token)
    code, _ = connect_refusal(lagging, new_token)
    assert code is close_codes.CONNECT_DENIED and not code.reconnect
