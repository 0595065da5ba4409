"""Create the cluster's Secret once, with a random password, from inside Kubernetes.

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
from dataclasses import dataclass
from pathlib import Path

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
    collection = f"/api/v1/namespaces/{api.namespace}/secrets"
    status = api.request("GET", f"{collection}/{name}")
    if status == 200:
        return "exists"
    if status != 404:
        raise RuntimeError(f"reading secret {name}: HTTP {status}")
    password = secrets.token_urlsafe(PASSWORD_BYTES)
    body: dict[str, object] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "migratory"}},
        "type": "Opaque",
        "data": {key: base64.b64encode(password.encode()).decode()},
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
    args = parser.parse_args(argv)
    try:
        outcome = ensure_secret(ApiServer.in_cluster(), args.name, args.key)
    except (KeyError, OSError, RuntimeError) as exc:
        print(f"migratory.kubernetes_secret: {exc}", file=sys.stderr)
        return 1
    print(f"secret {args.name}: {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
