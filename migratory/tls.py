"""TLS for the client listeners: the server's ``ssl.SSLContext`` from the config.

Only :mod:`ssl`, no sockets: the connection adapter runs the TLS state machine on
memory buffers (:class:`ssl.SSLObject`), see ``migratory.server.tls_link``.
"""

from __future__ import annotations

import os
import ssl
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from migratory.config_fields import ConfigFields

TLS_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


class TlsSetupError(ValueError):
    """The TLS keys do not make a usable context; ``key`` names the config key at fault."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, ssl.SSLError):
        return f"cannot read {exc.filename!r}: {exc.strerror}" if exc.filename else exc.strerror
    return str(getattr(exc, "reason", None) or exc)


def _check_file(key: str, path: str) -> None:
    """Opened here, each under its own key: OpenSSL's ``load_cert_chain`` reads the
    certificate and the key alike, and its refusal of either came back under the
    certificate's key without a file (``TlsCertificate: Permission denied`` for a key of
    mode 0600 owned by another user)."""
    if os.path.isdir(path):
        raise TlsSetupError(key, f"{path!r} is a directory, not a PEM file")
    if not os.path.isfile(path):
        raise TlsSetupError(key, f"no such file {path!r}")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        access = " (give this server's user read access to it)" if isinstance(
            exc, PermissionError) else ""
        raise TlsSetupError(key, f"cannot read {path!r}: {exc.strerror}{access}") from None


def _load_pair(
    context: ssl.SSLContext, certificate: tuple[str, str], key: tuple[str, str]
) -> None:
    """``load_cert_chain`` with a refusal that names the file at fault: OpenSSL says only
    ``PEM lib`` for a certificate file without a certificate and for a key file without
    a key alike, and ``KEY_VALUES_MISMATCH`` for a key of another certificate."""
    (cert_name, cert_path), (key_name, key_path) = certificate, key
    asked: list[bool] = []

    def no_passphrase() -> bytes:  # (without it OpenSSL asks for one on the terminal)
        asked.append(True)
        return b""

    try:
        context.load_cert_chain(cert_path, key_path or None, password=no_passphrase)
    except (OSError, ssl.SSLError) as exc:
        if asked:
            raise TlsSetupError(
                key_name, f"{key_path or cert_path!r} is encrypted: the server takes no "
                "passphrase (decrypt it: openssl pkey -in KEY -out KEY.plain)"
            ) from None
        if isinstance(exc, OSError) and not isinstance(exc, ssl.SSLError):
            raise TlsSetupError(cert_name, _reason(exc)) from None
        reason = _reason(exc)
    else:
        return
    try:
        ssl.create_default_context(cafile=cert_path)  # reads its certificates alone
    except (OSError, ssl.SSLError):
        raise TlsSetupError(cert_name, f"{cert_path!r} holds no PEM certificate") from None
    if "KEY_VALUES_MISMATCH" in reason:
        raise TlsSetupError(
            key_name, f"{key_path!r} is not the private key of {cert_name} {cert_path!r}"
        )
    raise TlsSetupError(
        key_name, f"{key_path or cert_path!r} holds no PEM private key (OpenSSL: {reason})"
    )


def server_context(config: ConfigFields) -> ssl.SSLContext:
    """The context for ``ListenEncrypted``: certificate, key, client CA, version, ciphers."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[config.tls_minimum_version]
    # no renegotiation: OpenSSL 3 refuses a client's by default, 1.1.1 accepts it (a
    # handshake's CPU on demand, over and over, on one connection)
    context.options |= (
        ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_RENEGOTIATION
    )
    try:
        context.set_ciphers(config.tls_ciphers)
    except ssl.SSLError:
        raise TlsSetupError("TlsCiphers", f"no usable cipher in {config.tls_ciphers!r}") from None
    for key, path in (
        ("TlsCertificate", config.tls_certificate),
        ("TlsKey", config.tls_key),
        ("TlsClientCa", config.tls_client_ca),
    ):
        if path:
            _check_file(key, path)
    _load_pair(context, ("TlsCertificate", config.tls_certificate), ("TlsKey", config.tls_key))
    if config.tls_client_ca:
        try:
            context.load_verify_locations(cafile=config.tls_client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise TlsSetupError("TlsClientCa", _reason(exc)) from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def cluster_contexts(
    certificate: str, key: str, ca: str
) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The (accepting, dialling) contexts of the cluster links: TLS 1.3 only, each side
    presents ``certificate`` and requires a peer certificate signed by the cluster CA
    ``ca`` (mutual TLS). Raises :class:`TlsSetupError` naming the ``ClusterTls*`` key.

    Host names are not checked: the CA signs member certificates only, so a certificate
    it signed is what makes a peer a member (a StatefulSet's pods share one); the
    password challenge inside the TLS session then names the member."""
    for name, path in (
        ("ClusterTlsCertificate", certificate),
        ("ClusterTlsKey", key),
        ("ClusterTlsCa", ca),
    ):
        _check_file(name, path)
    contexts = []
    for purpose in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
        context = ssl.SSLContext(purpose)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.check_hostname = False
        context.verify_mode = ssl.CERT_REQUIRED
        _load_pair(context, ("ClusterTlsCertificate", certificate), ("ClusterTlsKey", key))
        try:
            context.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise TlsSetupError("ClusterTlsCa", _reason(exc)) from None
        contexts.append(context)
    return contexts[0], contexts[1]
