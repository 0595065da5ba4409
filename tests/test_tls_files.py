"""migratory/tls.py: a certificate or key that cannot be used stops start-up with one
line naming the key (TlsCertificate or TlsKey, ClusterTls... alike) and the file at
fault.

Before: OpenSSL's words only, always under TlsCertificate -- a key of another
certificate ``cannot load the certificate and key: KEY_VALUES_MISMATCH``, an empty or
wrong key file and a certificate file without a certificate alike ``[SSL] PEM lib
(_ssl.c:3926)``, a directory ``no such file``; and an encrypted key made OpenSSL ask
``Enter PEM pass phrase:`` on the terminal (a server started by hand waited there),
then ``TlsCertificate: Invalid argument``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from migratory import tls
from migratory.config import Config, ConfigError

MIGRATORY = str(Path(sys.executable).with_name("migratory"))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    made: dict[str, Path] = {}
    for name in ("a", "b"):
        cert = ca.issue_cert(f"{name}.example")
        made[f"cert_{name}"] = directory / f"cert_{name}.pem"
        made[f"key_{name}"] = directory / f"key_{name}.pem"
        cert.cert_chain_pems[0].write_to_path(str(made[f"cert_{name}"]))
        cert.private_key_pem.write_to_path(str(made[f"key_{name}"]))
    key = serialization.load_pem_private_key(made["key_a"].read_bytes(), password=None)
    made["key_encrypted"] = directory / "key_encrypted.pem"
    made["key_encrypted"].write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"),
    ))
    made["empty"] = directory / "empty.pem"
    made["empty"].write_bytes(b"")
    made["garbage"] = directory / "garbage.pem"
    made["garbage"].write_bytes(bytes(range(256)) * 8)
    made["directory"] = directory
    return made


CASES = [
    ("cert_a", "key_b", "TlsKey (from setting): '{key_b}' is not the private key of "
     "TlsCertificate '{cert_a}'"),
    ("cert_a", "empty", "TlsKey (from setting): '{empty}' holds no PEM private key"),
    ("cert_a", "cert_a", "TlsKey (from setting): '{cert_a}' holds no PEM private key"),
    ("garbage", "key_a", "TlsCertificate (from setting): '{garbage}' holds no PEM certificate"),
    ("key_a", "key_a", "TlsCertificate (from setting): '{key_a}' holds no PEM certificate"),
    ("directory", "key_a",
     "TlsCertificate (from setting): '{directory}' is a directory, not a PEM file"),
    ("cert_a", "key_encrypted", "TlsKey (from setting): '{key_encrypted}' is encrypted: the "
     "server takes no passphrase"),
]


@pytest.mark.parametrize(("certificate", "key", "message"), CASES)
def test_the_refusal_names_the_key_and_the_file_at_fault(
    files: dict[str, Path], certificate: str, key: str, message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        Config.from_mapping({"ListenEncrypted": "127.0.0.1:0",
                             "TlsCertificate": str(files[certificate]),
                             "TlsKey": str(files[key])})
    assert str(refused.value).startswith(message.format(**files)), refused.value


@pytest.mark.parametrize(("key", "denied"), [
    ("TlsCertificate", "cert_a"), ("TlsKey", "key_a"), ("TlsClientCa", "cert_b")])
def test_a_file_the_server_may_not_read_is_named_under_its_own_key(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, key: str, denied: str
) -> None:
    """A file of another user's (mode 0600): before, by hand as a user without access,
    an unreadable key said 'TlsCertificate (from --set): Permission denied', the
    certificate's key and no file. The tests run as root, whom no mode refuses: the
    kernel's refusal is planted on that one file."""
    real_open = open

    def refusing_open(path: str, *args: Any) -> Any:
        if path == str(files[denied]):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args)

    monkeypatch.setattr(tls, "open", refusing_open, raising=False)
    with pytest.raises(ConfigError) as refused:
        Config.from_mapping({"ListenEncrypted": "127.0.0.1:0",
                             "TlsCertificate": str(files["cert_a"]),
                             "TlsKey": str(files["key_a"]), "TlsClientCa": str(files["cert_b"])})
    assert str(refused.value) == (f"{key} (from setting): cannot read '{files[denied]}': "
                                  "Permission denied (give this server's user read access to it)")


def test_a_matching_pair_is_taken(files: dict[str, Path]) -> None:
    config = Config.from_mapping({"ListenEncrypted": "127.0.0.1:0",
                                  "TlsCertificate": str(files["cert_a"]),
                                  "TlsKey": str(files["key_a"])})
    assert config.tls_key == str(files["key_a"])


def test_an_encrypted_key_is_one_line_and_no_passphrase_prompt(files: dict[str, Path]) -> None:
    """``migratory serve`` as an operator runs it: exit 2, one line, nothing asked."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIGRATORY_CFG_")}
    done = subprocess.run(
        [MIGRATORY, "serve", "--set", "Listen=127.0.0.1:0", "--set",
         "ListenEncrypted=127.0.0.1:0", "--set", f"TlsCertificate={files['cert_a']}",
         "--set", f"TlsKey={files['key_encrypted']}"],
        capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert re.fullmatch(
        r"migratory: configuration error: TlsKey \(from --set\): '.*' is encrypted: the "
        r"server takes no passphrase \(.*\)\n", done.stderr), done.stderr
