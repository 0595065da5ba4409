"""Create the cluster's Secrets once -- a random password and, with ``--tls-secret``, the
cluster links' TLS files -- from inside Kubernetes.

Run by the install's Job (``deploy/k8s/cluster-password.yaml``)::

    python -m migratory.kubernetes_secret --name migratory-cluster --key password

It reads the pod's service-account token and namespace, asks the API server for the
Secret and creates it only if it does not exist, so a re-install never changes the
password of a running cluster and no password is ever written in the repository.
Two plain HTTPS calls: no Kubernetes client library in the image.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from migratory.certificates import issue_cluster_certificates

ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PASSWORD_BYTES = 32


@dataclass(frozen=True, slots=True)
class ApiServer:
    url: str  # https://host:port
    token: str
    namespace: str
    context: ssl.SSLContext | None

    @classmethod
    def in_cluster(cls) -> ApiServer:
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        shown = f"[{host}]" if ":" in host else host
        return cls(
            url=f"https://{shown}:{port}",
            token=(ACCOUNT / "token").read_text().strip(),
            namespace=(ACCOUNT / "namespace").read_text().strip(),
            context=ssl.create_default_context(cafile=str(ACCOUNT / "ca.crt")),
        )

    def request(self, method: str, path: str, body: dict[str, object] | None = None) -> int:
        """The HTTP status of ``method path`` (errors are statuses too)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10, context=self.context) as reply:
                return int(reply.status)
        except urllib.error.HTTPError as exc:
            return exc.code


def ensure_secret(api: ApiServer, name: str, key: str) -> str:
    """Create Secret ``name`` with a random ``key`` unless it exists; what happened."""
    return _ensure(api, name, lambda: {key: secrets.token_urlsafe(PASSWORD_BYTES).encode()})


def cluster_tls_files(hosts: list[str]) -> dict[str, bytes]:
    """A new cluster CA and one member certificate for ``hosts`` that every pod shares
    (the CA signs nothing else; its key is not kept): the Secret's files."""
    ca_pem, issued = issue_cluster_certificates({"member": hosts})
    certificate_pem, key_pem = issued["member"]
    return {"ca.pem": ca_pem, "member.pem": certificate_pem, "member-key.pem": key_pem}


def ensure_tls_secret(api: ApiServer, name: str, hosts: list[str]) -> str:
    """Create Secret ``name`` with :func:`cluster_tls_files` unless it exists."""
    return _ensure(api, name, lambda: cluster_tls_files(hosts))


def _ensure(api: ApiServer, name: str, make: Callable[[], dict[str, bytes]]) -> str:
    collection = f"/api/v1/namespaces/{api.namespace}/secrets"
    status = api.request("GET", f"{collection}/{name}")
    if status == 200:
        return "exists"
    if status != 404:
        raise RuntimeError(f"reading secret {name}: HTTP {status}")
    body: dict[str, object] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "migratory"}},
        "type": "Opaque",
        "data": {k: base64.b64encode(v).decode() for k, v in make().items()},
    }
    status = api.request("POST", collection, body)
    if status == 201:
        return "created"
    if status == 409:  # another run created it first: theirs stands
        return "exists"
    raise RuntimeError(f"creating secret {name}: HTTP {status}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="the Secret's name")
    parser.add_argument("--key", default="password", help="the key that holds the password")
    parser.add_argument("--tls-secret", metavar="NAME",
                        help="also a Secret of cluster TLS files (ca.pem, member.pem, "
                        "member-key.pem) for the cluster links' mutual TLS")
    parser.add_argument("--tls-host", action="append", default=[], metavar="HOST",
                        help="a DNS name the member certificate is valid for (repeatable; "
                        "wildcards allowed)")
    args = parser.parse_args(argv)
    try:
        api = ApiServer.in_cluster()
        outcomes = {args.name: ensure_secret(api, args.name, args.key)}
        if args.tls_secret:
            outcomes[args.tls_secret] = ensure_tls_secret(
                api, args.tls_secret, args.tls_host or ["*.migratory-members"]
            )
    except (KeyError, OSError, RuntimeError) as exc:
        print(f"migratory.kubernetes_secret: {exc}", file=sys.stderr)
        return 1
    for name, outcome in outcomes.items():
        print(f"secret {name}: {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
