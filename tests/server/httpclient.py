"""Blocking test clients for the HTTP API and Server-Sent Events, on raw sockets + h11."""

from __future__ import annotations

import json
import socket
import ssl
import time
from typing import Any

import h11


class HttpClient:
    """One keep-alive connection; ``request`` sends one request and reads its response."""

    def __init__(
        self, port: int, *, tls: ssl.SSLContext | None = None, timeout: float = 5.0
    ) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock: socket.socket = (
            tls.wrap_socket(sock, server_hostname="localhost") if tls else sock
        )
        self.conn = h11.Connection(h11.CLIENT)

    def request(
        self,
        method: str,
        target: str,
        body: bytes = b"",
        headers: list[tuple[str, str]] | None = None,
    ) -> tuple[h11.Response, bytes]:
        fields = [("Host", "localhost"), *(headers or [])]
        if body or method == "POST":
            fields.append(("Content-Length", str(len(body))))
        data = self.conn.send(h11.Request(method=method, target=target, headers=fields))
        if body:
            data += self.conn.send(h11.Data(data=body))
        data += self.conn.send(h11.EndOfMessage())
        self.sock.sendall(data)
        return self.read_response()

    def read_response(self) -> tuple[h11.Response, bytes]:
        response, body = None, b""
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(self.sock.recv(65536))
                continue
            if isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert response is not None
                if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
                    self.conn.start_next_cycle()
                return response, body
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("closed before the response ended")

    def publish(self, **body: Any) -> tuple[int, dict[str, Any]]:
        response, data = self.request("POST", "/publish", json.dumps(body).encode(),
                                      [("Content-Type", "application/json")])
        return response.status_code, json.loads(data)

    def close(self) -> None:
        self.sock.close()


def header(response: h11.Response, name: str) -> str | None:
    for key, value in response.headers:
        if key.decode().lower() == name.lower():
            return value.decode("latin-1")
    return None


class SseClient:
    """A raw ``GET /events`` stream; :meth:`events` parses what arrives."""

    def __init__(
        self,
        port: int,
        subjects: list[str],
        *,
        last_event_id: str | None = None,
        tls: ssl.SSLContext | None = None,
        extra: str = "",
        timeout: float = 5.0,
    ) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock: socket.socket = (
            tls.wrap_socket(sock, server_hostname="localhost") if tls else sock
        )
        query = "&".join(f"subject={s}" for s in subjects) + extra
        head = f"GET /events?{query} HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n"
        if last_event_id is not None:
            head += f"Last-Event-ID: {last_event_id}\r\n"
        self.sock.sendall((head + "\r\n").encode())
        self.buffer = b""
        self.head = b""
        self.closed = False
        self.last_id: str | None = last_event_id

    def _fill(self, deadline: float) -> bool:
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        if not data:
            self.closed = True
            return False
        self.buffer += data
        if not self.head and b"\r\n\r\n" in self.buffer:
            self.head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        return True

    def next_block(self, timeout: float = 5.0) -> bytes | None:
        """The next event block (up to a blank line), comments included; None on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            if self.head and b"\n\n" in self.buffer:
                block, _, self.buffer = self.buffer.partition(b"\n\n")
                return block + b"\n\n"
            if self.closed or time.monotonic() > deadline:
                return None
            self._fill(deadline)

    def next_event(self, timeout: float = 5.0) -> dict[str, Any] | None:
        """The next dispatched event (comments and retry skipped): event, id, data (JSON)."""
        deadline = time.monotonic() + timeout
        while True:
            block = self.next_block(max(0.0, deadline - time.monotonic()))
            if block is None:
                return None
            fields: dict[str, str] = {}
            for line in block.decode().split("\n"):
                if line and not line.startswith(":"):
                    name, _, value = line.partition(":")
                    fields[name] = value[1:] if value.startswith(" ") else value
            if "data" not in fields:
                continue
            if "id" in fields:
                self.last_id = fields["id"]
            return {"event": fields.get("event", "message"), "id": fields.get("id"),
                    "data": json.loads(fields["data"])}

    @property
    def status(self) -> int | None:
        """The response's status (None before its head came)."""
        return int(self.head.split(b" ", 2)[1]) if self.head else None

    def wait_head(self, timeout: float = 5.0) -> int | None:
        """The response's status once its head came (None: no head in time)."""
        deadline = time.monotonic() + timeout
        while not self.head and not self.closed and time.monotonic() < deadline:
            self._fill(deadline)
        return self.status

    def events_until(self, name: str, timeout: float = 5.0) -> list[dict[str, Any]]:
        out = []
        while True:
            event = self.next_event(timeout)
            assert event is not None, (
                f"no {name!r} event; got {out}; response {self.head[:200]!r}, "
                f"then {self.buffer[:300]!r}, closed: {self.closed}")
            out.append(event)
            if event["event"] == name:
                return out

    def close(self) -> None:
        self.sock.close()


def message_ids(events: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(e["data"]["type"], e["data"]["seq"]) for e in events if e["event"] == "message"]

