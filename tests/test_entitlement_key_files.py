"""Entitlement = Token's key files: one that cannot be read, one the server's user may not
read, a JWKS that is not JSON, a private key where the public key belongs -- each refused
at start-up with the key and the file named, and what to do."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from migratory.config import Config, ConfigError
from migratory.entitlement import entitlement_from_config


def token_config(tmp_path: Path, **settings: str) -> Config:
    return Config.from_mapping({"Entitlement": "Token", **settings})


@pytest.mark.parametrize(("make", "why"), [
    (lambda tmp: tmp / "none.key", "No such file or directory"),
    (lambda tmp: tmp, "Is a directory"),
])
def test_a_token_key_file_that_cannot_be_read_names_the_key_and_the_file(
    tmp_path: Path, make: Callable[[Path], Path], why: str
) -> None:
    """Before: 'Entitlement = Token: [Errno 2] No such file or directory: ...', the key
    not named (which of EntitlementTokenKeyFile and EntitlementTokenJwksFile?)."""
    path = make(tmp_path)
    for key in ("EntitlementTokenKeyFile", "EntitlementTokenJwksFile"):
        algorithm = "RS256" if key == "EntitlementTokenJwksFile" else "HS256"
        with pytest.raises(ConfigError) as refused:
            entitlement_from_config(token_config(
                tmp_path, EntitlementTokenAlgorithm=algorithm, **{key: str(path)}))
        assert str(refused.value) == f"Entitlement = Token: {key} {path}: {why}"


def test_a_token_key_file_the_server_may_not_read_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key file of another user's, mode 0600 (by hand, as a user without access). The
    tests run as root, whom no mode refuses: the kernel's refusal is planted on it."""
    path = tmp_path / "other-users.key"
    path.write_text("s" * 40)

    def refused_read(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refused_read)
    with pytest.raises(ConfigError) as refused:
        entitlement_from_config(token_config(tmp_path, EntitlementTokenKeyFile=str(path)))
    assert str(refused.value) == (f"Entitlement = Token: EntitlementTokenKeyFile {path}: "
                                  "Permission denied (give this server's user read access to it)")


def test_a_jwks_file_that_is_not_json_says_so(tmp_path: Path) -> None:
    """Before: 'EntitlementTokenJwksFile ...: Expecting value: line 1 column 1 (char 0)',
    json's words alone (a PEM key given as the JWKS, say)."""
    path = tmp_path / "key.pem"
    path.write_text("-----BEGIN PUBLIC KEY-----\n")
    with pytest.raises(ConfigError) as refused:
        entitlement_from_config(token_config(
            tmp_path, EntitlementTokenAlgorithm="RS256", EntitlementTokenJwksFile=str(path)))
    assert str(refused.value) == (
        f"Entitlement = Token: EntitlementTokenJwksFile {path}: not JSON (Expecting value at "
        "line 1 column 1): a JWKS is a JSON object with 'keys'")


@pytest.mark.parametrize("algorithm", ["RS256", "ES256"])
def test_a_private_key_as_the_verification_key_is_refused(tmp_path: Path, algorithm: str) -> None:
    """Before: taken (PyJWT verifies with a private key's public half), so the server's
    config held a key that signs any token -- found by giving ``EntitlementTokenKeyFile``
    the ES256 private key of a key pair, which started the server. docs/security.md asks
    for the public key."""
    private = (rsa.generate_private_key(public_exponent=65537, key_size=2048)
               if algorithm == "RS256" else ec.generate_private_key(ec.SECP256R1()))
    path = tmp_path / "signing.pem"
    path.write_bytes(private.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    with pytest.raises(ConfigError) as refused:
        entitlement_from_config(token_config(
            tmp_path, EntitlementTokenAlgorithm=algorithm, EntitlementTokenKeyFile=str(path)))
    assert str(refused.value).startswith(
        f"Entitlement = Token: EntitlementTokenKeyFile {path}: holds a private key: the "
        "server verifies tokens with the public key alone"), refused.value
    assert str(refused.value).endswith(f"(openssl pkey -in {path} -pubout -out public.pem)")
    jwks = tmp_path / "signing.jwks"
    jwk = json.loads(jwt.algorithms.get_default_algorithms()[algorithm].to_jwk(private))
    jwks.write_text(json.dumps({"keys": [{**jwk, "kid": "k1"}]}))
    with pytest.raises(ConfigError, match=r"EntitlementTokenJwksFile .*: holds a private key"):
        entitlement_from_config(token_config(
            tmp_path, EntitlementTokenAlgorithm=algorithm, EntitlementTokenJwksFile=str(jwks)))
    public = private.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    path.write_bytes(public)  # its public key is taken
    entitlement_from_config(token_config(
        tmp_path, EntitlementTokenAlgorithm=algorithm, EntitlementTokenKeyFile=str(path)))
