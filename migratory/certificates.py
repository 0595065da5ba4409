"""A cluster CA and member certificates for mutual TLS on the cluster links.

``migratory cluster up`` makes them for its loopback members; on Kubernetes the
install's Job makes a set once and keeps it in a Secret (``migratory.kubernetes_secret
--tls-secret``): the CA's certificate, and a certificate and its key. The CA's
own key is not kept: nothing can sign another member later, so adding members means a
new set (and a rolling restart). Private keys are written mode 0600.

Elliptic-curve keys (P-256), ten years of validity: the certificates authenticate
members to each other, nothing else trusts them.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=3650)


@dataclass(frozen=True, slots=True)
class MemberCertificate:
    """The ClusterTlsCertificate, ClusterTlsKey and ClusterTlsCa files of one member."""

    certificate: Path
    key: Path
    ca: Path

    def settings(self) -> dict[str, str]:
        return {
            "ClusterTlsCertificate": str(self.certificate),
            "ClusterTlsKey": str(self.key),
            "ClusterTlsCa": str(self.ca),
        }


def _name(common_name: str) -> x509.Name:
    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "migratory cluster"),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
    ])


def _alt_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write(path: Path, data: bytes, *, private: bool) -> None:
    mode = 0o600 if private else 0o644
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    os.chmod(path, mode)  # an existing file keeps its old mode through O_CREAT


def issue_cluster_certificates(
    members: dict[str, list[str]],
) -> tuple[bytes, dict[str, tuple[bytes, bytes]]]:
    """A new CA and, for each member name, a certificate valid for its ``hosts`` (IP
    addresses or DNS names, wildcards allowed), both for serving and dialling links:
    ``(ca_pem, {member: (certificate_pem, key_pem)})``. Nothing is written."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("migratory cluster CA")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    issued: dict[str, tuple[bytes, bytes]] = {}
    for member, hosts in members.items():
        key = ec.generate_private_key(ec.SECP256R1())
        certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(member))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.SubjectAlternativeName([_alt_name(h) for h in hosts]), critical=False
            )
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        issued[member] = (
            certificate.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )
    return ca.public_bytes(serialization.Encoding.PEM), issued


def make_cluster_certificates(
    directory: Path, members: dict[str, list[str]]
) -> dict[str, MemberCertificate]:
    """:func:`issue_cluster_certificates` written in ``directory``: ``ca.pem``,
    ``MEMBER.pem`` and ``MEMBER-key.pem`` (mode 0600)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_pem, issued = issue_cluster_certificates(members)
    ca_path = directory / "ca.pem"
    _write(ca_path, ca_pem, private=False)
    made: dict[str, MemberCertificate] = {}
    for member, (certificate_pem, key_pem) in issued.items():
        cert_path = directory / f"{member}.pem"
        key_path = directory / f"{member}-key.pem"
        _write(cert_path, certificate_pem, private=False)
        _write(key_path, key_pem, private=True)
        made[member] = MemberCertificate(cert_path, key_path, ca_path)
    return made
