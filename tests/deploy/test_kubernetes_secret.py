"""The install's Job creates the cluster Secret once, against a stand-in API server."""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from migratory.kubernetes_secret import ApiServer, ensure_secret, ensure_tls_secret
from migratory.tls import cluster_contexts

TOKEN = "service-account-token"


class FakeApi(BaseHTTPRequestHandler):
    secrets: dict[str, dict[str, object]]
    refuse: int | None = None  # answer every request with this status
    race: bool = False  # another run creates the Secret between our GET and POST

    def _reply(self, status: int, body: object = None) -> None:
        data = json.dumps(body or {}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _allowed(self) -> bool:
        if self.refuse is not None:
            self._reply(self.refuse)
            return False
        if self.headers["Authorization"] != f"Bearer {TOKEN}":
            self._reply(401)
            return False
        return True

    def do_GET(self) -> None:
        if not self._allowed():
            return
        name = self.path.rsplit("/", 1)[1]
        if self.path.startswith("/api/v1/namespaces/ns/secrets/") and name in self.secrets:
            self._reply(200, self.secrets[name])
        else:
            self._reply(404)

    def do_POST(self) -> None:
        if not self._allowed():
            return
        assert self.path == "/api/v1/namespaces/ns/secrets"
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        name = body["metadata"]["name"]
        if self.race:
            self.secrets[name] = {"data": {"password": "theirs"}}
        if name in self.secrets:
            self._reply(409)
            return
        self.secrets[name] = body
        self._reply(201, body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api() -> Iterator[tuple[ApiServer, type[FakeApi]]]:
    handler = type("Handler", (FakeApi,), {"secrets": {}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield ApiServer(f"http://127.0.0.1:{server.server_port}", TOKEN, "ns", None), handler
    finally:
        server.shutdown()
        server.server_close()


def test_creates_a_random_password_once(api: tuple[ApiServer, type[FakeApi]]) -> None:
    server, handler = api
    assert ensure_secret(server, "migratory-cluster", "password") == "created"
    secret = handler.secrets["migratory-cluster"]
    password = base64.b64decode(secret["data"]["password"])  # type: ignore[index]
    assert len(password) >= 32
    assert ensure_secret(server, "migratory-cluster", "password") == "exists"
    assert handler.secrets["migratory-cluster"] is secret  # never replaced


def test_two_runs_at_once_keep_the_first_password(api: tuple[ApiServer, type[FakeApi]]) -> None:
    server, handler = api
    handler.race = True
    assert ensure_secret(server, "migratory-cluster", "password") == "exists"
    assert handler.secrets["migratory-cluster"] == {"data": {"password": "theirs"}}


def test_refusal_is_an_error_not_a_silent_success(
    api: tuple[ApiServer, type[FakeApi]],
) -> None:
    server, handler = api
    handler.refuse = 403
    with pytest.raises(RuntimeError, match="HTTP 403"):
        ensure_secret(server, "migratory-cluster", "password")


def test_passwords_differ_between_installs(api: tuple[ApiServer, type[FakeApi]]) -> None:
    server, handler = api
    ensure_secret(server, "a", "password")
    ensure_secret(server, "b", "password")
    assert handler.secrets["a"]["data"] != handler.secrets["b"]["data"]


def test_creates_the_cluster_tls_secret_once(
    api: tuple[ApiServer, type[FakeApi]], tmp_path: Path
) -> None:
    """The files make working mutual-TLS contexts: what a member loads from the mount."""
    server, handler = api
    assert ensure_tls_secret(server, "migratory-cluster-tls", ["*.migratory-members"]) == "created"
    secret = handler.secrets["migratory-cluster-tls"]
    for name, encoded in secret["data"].items():  # type: ignore[attr-defined]
        (tmp_path / name).write_bytes(base64.b64decode(encoded))
    accepting, dialling = cluster_contexts(
        str(tmp_path / "member.pem"), str(tmp_path / "member-key.pem"), str(tmp_path / "ca.pem")
    )
    assert accepting.verify_mode is ssl.CERT_REQUIRED and dialling.verify_mode is ssl.CERT_REQUIRED
    assert ensure_tls_secret(server, "migratory-cluster-tls", ["x"]) == "exists"
    assert handler.secrets["migratory-cluster-tls"] is secret
