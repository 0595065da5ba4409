#!/usr/bin/env python3
"""CPU per WebSocket opening handshake parsed: h11 (the server's HTTP, since issue 10)
against the hand-written parser it replaced (read from git, commit ec40042).

    .venv/bin/python benchmarks/http_handshake_parse.py [--count 20000]

In process, one core, best of 5 rounds. Not the hot path: a handshake is parsed
once per connection; the figure says what a reconnect storm costs.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from migratory.protocol.http import handshake_request, new_websocket_key
from migratory.protocol.http_server import HttpServer, UpgradeRequested

OLD = "ec40042:migratory/protocol/http.py"


def old_parser() -> type:
    source = subprocess.run(["git", "show", OLD], capture_output=True, check=True,
                            cwd=Path(__file__).resolve().parent).stdout
    path = Path(tempfile.mkdtemp()) / "old_http.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("old_http", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_http"] = module
    spec.loader.exec_module(module)
    return module.RequestParser  # type: ignore[no-any-return]


def best_us(run: Callable[[], None], count: int) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(count):
            run()
        best = min(best, (time.perf_counter() - start) / count)
    return best * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20000)
    args = parser.parse_args()
    request = handshake_request("127.0.0.1:8800", "/", new_websocket_key())

    def with_h11() -> None:
        server = HttpServer(max_body=0)
        server.receive_data(request)
        assert isinstance(server.next_event(), UpgradeRequested)

    print(f"h11 HttpServer: {best_us(with_h11, args.count):.1f} us per handshake")
    try:
        legacy = old_parser()
    except (subprocess.CalledProcessError, OSError) as exc:
        print(f"old parser not available from git ({exc}); h11 figure only")
        return 0

    def hand_written() -> None:
        assert legacy().receive_data(request).is_websocket_upgrade

    print(f"hand-written (ec40042): {best_us(hand_written, args.count):.1f} us per handshake")
    return 0


if __name__ == "__main__":
    sys.exit(main())
