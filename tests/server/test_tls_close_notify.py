"""A member's end of a TLS connection is a ``close_notify`` before its FIN. Before, only
the FIN: a client that does not take a bare FIN for the end (Python's ssl with
``suppress_ragged_eofs=False``, and every client that guards against truncation) saw
``EOF occurred in violation of protocol`` after the drain's close frame -- a truncated
stream, not a clean end."""

from __future__ import annotations

import os
import signal
import ssl
from pathlib import Path
from typing import Any

import trustme
from rawclient import RawClient
from tls_files import write_tls_files

from migratory.protocol import close_codes, ops
from migratory.protocol import websocket as ws


def test_a_drained_wss_client_reads_a_close_notify_not_a_bare_fin(
    start_server: Any, tmp_path: Path,
) -> None:
    files = write_tls_files(trustme.CA(), tmp_path)
    server = start_server(listeners=2, ListenEncrypted="127.0.0.1:0", DrainTime="5",
                          TlsCertificate=files["TlsCertificate"], TlsKey=files["TlsKey"])
    tls = ssl.create_default_context(cafile=files["ca"])
    client = RawClient(int(server.urls[1].rsplit(":", 1)[1]), timeout=30, tls=tls)
    client.sock.suppress_ragged_eofs = False  # type: ignore[attr-defined]
    try:
        client.connect("ends")
        client.subscribe("/Tls/End")
        client.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW)
        server.proc.send_signal(signal.SIGTERM)
        assert client.recv_close().code == close_codes.DRAINED.code
        client.send_raw(ws.encode_close(close_codes.DRAINED.code, "", mask=os.urandom(4)))
        assert client.sock.recv(1) == b""  # before: ssl.SSLEOFError
        assert server.proc.wait(30) == 0
    finally:
        client.close()
    assert "Traceback" not in server.log()
