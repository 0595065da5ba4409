"""A blocking raw-socket test client built on our own sans-I/O codecs."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import time
import weakref

from migratory.model.message import Message
from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import check_handshake_response, handshake_request, new_websocket_key

OPEN: weakref.WeakSet[RawClient] = weakref.WeakSet()
"""The clients not closed yet (:func:`close_clients_of`)."""


def close_clients_of(ports: set[int]) -> int:
    """Close every open client of a server on one of ``ports``, before the test stops it;
    returns how many. A client left open there does not answer the server's close frame
    (nothing reads it): the server's drain waits the close linger for it, 5 s per stop
    (connection_linger.py's CLOSE_LINGER_SECONDS). Shut down first: a thread of the test
    still blocked in ``recv`` on one (a publisher) would hold its FIN back."""
    ending = [client for client in OPEN if client.port in ports]
    for client in ending:
        with contextlib.suppress(OSError):
            client.sock.shutdown(socket.SHUT_RDWR)
        client.close()
    return len(ending)


class RawClient:
    def __init__(self, port: int, *, timeout: float = 5.0, handshake: bool = True,
                 tls: ssl.SSLContext | None = None) -> None:
        self.port = port
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock = sock if tls is None else tls.wrap_socket(sock, server_hostname="localhost")
        OPEN.add(self)
        self.decoder = ws.FrameDecoder(client_frames=False, max_message_size=64 << 20)
        self.timeout = timeout
        if handshake:
            self._handshake()

    def _handshake(self) -> None:
        key = new_websocket_key()
        self.sock.sendall(handshake_request("127.0.0.1", "/", key))
        buf = b""
        while True:
            chunk = self.sock.recv(65536)
            assert chunk, "server closed during handshake"
            buf += chunk
            used = check_handshake_response(buf, key)
            if used is not None:
                self.decoder.receive_data(buf[used:])
                return

    # --- sending ---------------------------------------------------------------

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_payload(self, payload: bytes) -> None:
        self.send_raw(ws.encode_masked_binary(payload, os.urandom(4)))

    def send_op(self, op: ops.ClientOp) -> None:
        self.send_payload(ops.encode_client_op(op))

    def connect(self, name: str = "test", token: str | None = None) -> ops.Connected:
        self.send_op(ops.Connect(client=name, token=token))
        reply = self.recv_op()
        assert isinstance(reply, ops.Connected), reply
        return reply

    def subscribe(self, subject: str, **kw: object) -> None:
        self.send_op(ops.Subscribe((ops.SubscriptionRequest(subject, **kw),)))  # type: ignore[arg-type]

    def publish(self, message: Message) -> ops.PublishStatus:
        self.send_op(ops.Publish(message))
        reply = self.recv_op()
        assert isinstance(reply, ops.PublishStatus), reply
        return reply

    # --- receiving ---------------------------------------------------------------

    def recv_event(self, timeout: float | None = None) -> ws.Event:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            event = self.decoder.next_event()
            if event is not None:
                return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no WebSocket event in time")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the TCP connection")
            self.decoder.receive_data(chunk)

    def recv_op(self, timeout: float | None = None) -> ops.ServerOp:
        event = self.recv_event(timeout)
        if not isinstance(event, ws.BinaryMessage):
            raise AssertionError(f"expected a binary message, got {event!r}")
        return ops.decode_server_op(event.data)

    def recv_ops_until_status(
        self, status: ops.Status, timeout: float | None = None
    ) -> list[ops.ServerOp]:
        out = []
        while True:
            op = self.recv_op(timeout)
            out.append(op)
            if isinstance(op, ops.SubjectStatus) and op.status is status:
                return out

    def recv_messages(self, count: int, timeout: float | None = None) -> list[Message]:
        messages: list[Message] = []
        while len(messages) < count:
            op = self.recv_op(timeout)
            assert isinstance(op, ops.Deliver), op
            messages.extend(op.messages)
        return messages

    def recv_close(self, timeout: float | None = None) -> ws.CloseReceived:
        while True:
            event = self.recv_event(timeout)
            if isinstance(event, ws.CloseReceived):
                return event

    def close(self) -> None:
        OPEN.discard(self)
        self.sock.close()


def delivered(ops_list: list[ops.ServerOp]) -> list[Message]:
    return [m for op in ops_list if isinstance(op, ops.Deliver) for m in op.messages]
