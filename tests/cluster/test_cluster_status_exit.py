"""``migratory cluster status`` exits 0 only when every member answered and is ready, so
a script can ask it (``migratory cluster status --server URL && ...``). Before: 0
whatever the table said -- every member DOWN included -- and a single server, which
answers ``/cluster`` with 404, was shown DOWN as if it did not run."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

MIGRATORY = str(Path(sys.executable).with_name("migratory"))


def member(ready: bool | None) -> type[BaseHTTPRequestHandler]:
    """A member's HTTP port: ``/cluster`` as a seed (ready or not), or (None) a single
    server's answer, 404 'not a cluster member'."""

    class Member(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if ready is None:
                status, body = 404, b"not a cluster member"
            elif self.path == "/cluster":
                status, body = 200, json.dumps({"index": 0, "role": "seed", "ready": ready,
                                                "applied_clsn": 3}).encode()
            else:
                status, body = 200, b"{}"
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Member


@pytest.fixture
def serve() -> Iterator[list[ThreadingHTTPServer]]:
    servers: list[ThreadingHTTPServer] = []
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def url(servers: list[ThreadingHTTPServer], ready: bool | None) -> str:
    server = ThreadingHTTPServer(("127.0.0.1", 0), member(ready))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    servers.append(server)
    return f"ws://127.0.0.1:{server.server_address[1]}"


def status(*urls: str) -> subprocess.CompletedProcess[str]:
    args = [MIGRATORY, "cluster", "status"]
    for one in urls:
        args += ["--server", one]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def test_every_member_ready_is_0(serve: list[ThreadingHTTPServer]) -> None:
    done = status(url(serve, True), url(serve, True))
    assert done.returncode == 0, done.stdout


def test_a_member_not_ready_or_down_is_1(serve: list[ThreadingHTTPServer]) -> None:
    done = status(url(serve, True), url(serve, False))
    assert done.returncode == 1, done.stdout
    closed = url(serve, True)
    serve.pop().server_close()  # nothing listens there any more
    done = status(url(serve, True), closed)
    assert done.returncode == 1, done.stdout
    assert done.stdout.splitlines()[2].split()[:2] == [closed, "DOWN"]


def test_a_single_server_is_not_shown_down(serve: list[ThreadingHTTPServer]) -> None:
    single = url(serve, None)
    done = status(single)
    assert done.returncode == 1, done.stdout
    row = done.stdout.splitlines()[1]
    assert row.split()[:2] == [single, "?"], row
    assert row.endswith("(HTTP 404: not a cluster member)"), row


def test_a_server_that_is_not_a_url_is_refused_naming_it() -> None:
    """``--server 127.0.0.1:8800`` (no scheme): before, a row ``DOWN`` saying
    ``<urlopen error unknown url type: 127.0.0.1>``, exit 1, as if the member were down."""
    done = status("127.0.0.1:8800")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines()[-1] == (
        "migratory cluster status: error: argument --server: expected a member's client URL"
        " such as ws://127.0.0.1:8800, got '127.0.0.1:8800'")
