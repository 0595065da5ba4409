"""An SSE stream resumed from far behind catches up at the reader's pace (sse_stream.py:
the backlog goes into the outbox as the socket drains; only live events count against
ClientMaxPendingBytes), and a reader that stops is still cut off."""

from __future__ import annotations

import socket
import time
from typing import Any

from httpclient import HttpClient, SseClient
from mqttclient import stats
from test_sse import browser_id, missed_after_first, publish, server_epoch

from migratory.protocol import close_codes

A = "/Stocks/NYSE/IBM"


def test_a_resume_far_behind_catches_up_while_publishing_goes_on(start_server: Any) -> None:
    """400 missed messages of ~300 bytes (~30 x ClientMaxPendingBytes), one more
    published for every 80 events read (then one per event once live): the stream gets
    every missed one, its sync, then the live ones, in order, without a cut. It used to
    be answered whole and cut at the limit (close 4500), then again at every
    reconnection behind a busy subject (chaos --sse-subscribers). The live ones
    published meanwhile wait behind the backlog the server still holds (6 of them, 2 kB,
    in a run at one per 40 events read), counted: at most 400 / 80 x 358 bytes however
    little the kernel's buffers hold, within the 3 kB left beside the outbox's 1 kB. (A
    reader hardly faster than the publisher, one published per 4 events read, is cut,
    as it should be.)"""
    server = start_server(BatchTime="0", ClientMaxPendingBytes="4096",
                          MaxMessageSize="2048")
    last, missed = missed_after_first(server.port, 400)
    publisher = HttpClient(server.port)
    resumed = SseClient(server.port, [A], last_event_id=last)
    events: list[dict[str, Any]] = []
    published = missed[-1]
    for _ in range(2_000):  # bounded: 400 recovered + the live ones
        event = resumed.next_event()
        assert event is not None, events[-3:]
        events.append(event)
        assert event["event"] != "close", event
        synced = any(e["event"] == "sync" for e in events)
        if (synced or len(events) % 80 == 0) and published < missed[-1] + 30:
            status, body = publisher.publish(subject=A, content=f"live{published}" + "l" * 200)
            assert status == 200, body
            published = body["seq"]
        seqs = [e["data"]["seq"] for e in events if e["event"] == "message"]
        if published >= missed[-1] + 30 and seqs and seqs[-1] == published:
            break
    resumed.close()
    publisher.close()
    kinds = [e["event"] for e in events]
    assert kinds.count("sync") == 1
    sync = kinds.index("sync")
    recovered = [e["data"] for e in events[:sync] if e["event"] == "message"]
    # (answered in slices: what was published between two is recovered by a later one)
    synced_at = events[sync]["data"]["seq"]
    assert synced_at >= missed[-1]
    assert [m["seq"] for m in recovered] == list(range(2, synced_at + 1))
    assert {m["type"] for m in recovered} == {"recovered"}
    live = [e["data"] for e in events[sync:] if e["event"] == "message"]
    assert [m["seq"] for m in live] == list(range(synced_at + 1, published + 1))
    assert {m["type"] for m in live} == {"update"}
    counts = stats(server.port)
    assert counts["slow_consumers"] == 0 and counts["resumes"] == {"sync": 1}


def eight_megabytes_missed(port: int) -> int:
    """A's first message, then 400 of 20 kB (more than the kernel's buffers); A's epoch."""
    publish(port, A, "first")
    epoch = server_epoch(port, A)
    contents = [f"{n:03d}" + "m" * 20_000 for n in range(400)]
    for start in range(0, 400, 50):
        publish(port, A, *contents[start:start + 50])
    return epoch


def stopped_reader(port: int, last_id: str) -> socket.socket:
    """A stream resumed from ``last_id`` whose client reads nothing (a small window)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET /events?subject={A} HTTP/1.1\r\nHost: x\r\nLast-Event-ID: {last_id}"
                 "\r\n\r\n".encode())
    return sock


def read_to_close(sock: socket.socket) -> bytes:
    """Everything until the server closes (bounded: a stream never closed fails)."""
    sock.settimeout(10)
    received = b""
    deadline = time.monotonic() + 30
    while chunk := sock.recv(1 << 20):  # the server closed it: the stream ends
        received += chunk
        assert time.monotonic() < deadline, received[-300:]
    sock.close()
    return received


def resumable_cut(received: bytes, epoch: int) -> None:
    """A close 4500 whose id, as a browser holds it, is the last message it got, after
    every message from seq 2 on without a gap."""
    assert b"event:close" in received and b'"code":%d' % close_codes.SLOW_CONSUMER.code in (
        received
    ), received[-300:]
    body = received.partition(b"\r\n\r\n")[2]
    held, last_seq = browser_id(body)
    assert last_seq is not None and held == f"{epoch}:{last_seq}", (held, last_seq)
    seqs = [int(line.split(b'"seq":')[1].split(b",")[0]) for line in body.split(b"\n")
            if line.startswith(b"data:") and b"\"content\":" in line]
    assert seqs == list(range(2, last_seq + 1))


def test_a_stopped_reader_resuming_far_behind_is_cut_while_live_messages_come(
    start_server: Any,
) -> None:
    """~8 MB missed (more than the kernel's buffers), a reader that stops while 8 MB of
    live messages are published: cut off (4500), its id naming the last message sent.
    (Its resume is answered a slice at a time, as the socket drains: the stream is not
    subscribed until its last slice, the live messages wait in the cache, not in a
    backlog of its own -- what cuts it is that nothing moves for two heartbeat
    intervals.)"""
    server = start_server(BatchTime="0", ClientMaxPendingBytes="262144",
                          SseHeartbeatInterval="1")
    epoch = eight_megabytes_missed(server.port)
    slow = stopped_reader(server.port, f"{epoch}:1")
    publisher = HttpClient(server.port)
    for n in range(200):  # far more than 128 kB of live messages
        status, body = publisher.publish(subject=A, content=f"live{n}" + "l" * 20_000)
        assert status == 200, body
    publisher.close()
    resumable_cut(read_to_close_after_stop(slow), epoch)
    assert stats(server.port)["slow_consumers"] == 1


def test_a_stopped_reader_catching_up_with_nothing_published_is_cut_by_its_heartbeat(
    start_server: Any,
) -> None:
    """Nothing published after the resume: a catch-up that moves nothing for two
    heartbeat intervals in a row is cut off, instead of holding its backlog forever."""
    server = start_server(BatchTime="0", ClientMaxPendingBytes="262144",
                          SseHeartbeatInterval="1")
    epoch = eight_megabytes_missed(server.port)
    received = read_to_close_after_stop(stopped_reader(server.port, f"{epoch}:1"))
    assert stats(server.port)["slow_consumers"] == 1
    resumable_cut(received, epoch)


def read_to_close_after_stop(sock: socket.socket) -> bytes:
    """Wait, reading nothing, until the server cut the stream off; then read it all."""
    port = sock.getpeername()[1]
    for _ in range(100):  # bounded: the cut comes within two heartbeat intervals
        if stats(port)["slow_consumers"]:
            break
        time.sleep(0.1)
    return read_to_close(sock)
