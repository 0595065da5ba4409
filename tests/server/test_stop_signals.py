"""SIGTERM drains (up to DrainTime); a SIGINT (Ctrl-C) during that drain stops the
server at once, as a SIGINT does before one (migratory/server/run.py). Before, it was
queued and nobody read it: the operator's Ctrl-C did nothing until the drain ended --
here ~5 s (the client, told to go, never closes: its close times out), DrainTime when
publishes cannot settle (a member cut off from its seeds)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from rawclient import RawClient

from migratory.protocol import close_codes, ops
from migratory.protocol import websocket as ws


def wait_logged(server: Any, text: str) -> None:
    for _ in range(1000):  # (a guard: 10 s)
        if text in server.log():
            return
        time.sleep(0.01)
    raise AssertionError(f"never logged {text!r}:\n{server.log()}")


def test_a_sigint_during_the_drain_stops_the_server_at_once(start_server: Any) -> None:
    server = start_server(DrainTime="3600")
    client = RawClient(server.port)
    client.connect("stays")  # reads nothing more: it never leaves by itself
    try:
        server.proc.send_signal(signal.SIGTERM)
        wait_logged(server, "draining 1 clients (DrainTime 3600 s)")
        server.proc.send_signal(signal.SIGTERM)  # a second one: logged, the drain goes on
        wait_logged(server, "SIGTERM received: draining already")
        assert server.proc.poll() is None
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(30) == 0  # (the 30 s a guard: before, an hour's drain)
    finally:
        client.sock.close()
    log = server.log()
    assert "SIGINT received while draining: stopping at once" in log
    assert "drained in" not in log  # cut short: before, it ran to its end (5.0 s here)
    assert "Traceback" not in log


def test_a_client_that_answered_the_close_has_left_without_closing_its_socket(
    start_server: Any,
) -> None:
    """A client told to go (4502) that answers with its close frame has read everything
    before it: the drain is done with it, whether its FIN comes or not. Before, the drain
    waited for the FIN (the connection's close linger, 5 s): a client behind a proxy that
    keeps the server's side open (the play's Service), or an SDK that shuts its socket
    later, held every pod's termination 5 s. DrainTime (2 s) is shorter than that linger:
    before, this client was cut at DrainTime."""
    server = start_server(DrainTime="2")
    client = RawClient(server.port, timeout=30)
    client.connect("answers")
    client.subscribe("/Drain/Answer")
    client.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW)
    try:
        server.proc.send_signal(signal.SIGTERM)
        close = client.recv_close()
        assert close.code == close_codes.DRAINED.code
        client.send_raw(ws.encode_close(close.code, "", mask=os.urandom(4)))
        # (the socket stays open, never shut down: no FIN from this client)
        assert server.proc.wait(30) == 0
    finally:
        client.sock.close()
    log = server.log()
    assert "of the 1 clients at the start 1 left as told, 0 on their own, 0 cut" in log
    assert "DrainTime reached" not in log
