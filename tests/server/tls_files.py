"""Certificate files for a TLS listener, made with trustme (the tests' shared helper)."""

from __future__ import annotations

from pathlib import Path

import trustme


def write_tls_files(ca: trustme.CA, directory: Path) -> dict[str, str]:
    """A certificate for localhost and 127.0.0.1 signed by ``ca``: the paths of
    ``TlsCertificate``, ``TlsKey`` (the settings' names) and ``ca`` (for the clients)."""
    cert = ca.issue_cert("localhost", "127.0.0.1")
    paths = {"TlsCertificate": directory / "cert.pem", "TlsKey": directory / "key.pem",
             "ca": directory / "ca.pem"}
    cert.private_key_pem.write_to_path(str(paths["TlsKey"]))
    with paths["TlsCertificate"].open("wb") as out:
        for blob in cert.cert_chain_pems:
            out.write(blob.bytes())
    ca.cert_pem.write_to_path(str(paths["ca"]))
    return {key: str(path) for key, path in paths.items()}
