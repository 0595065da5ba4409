"""Server-Sent Events on a real server: ids are positions, exact resume with
Last-Event-ID, resync when it cannot be exact, heartbeats, slow readers cut off."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import jwt
from httpclient import HttpClient, SseClient, message_ids
from mqttclient import MqttRawClient, stats

from migratory.protocol import close_codes

A, B = "/Stocks/NYSE/IBM", "/Stocks/NYSE/MSFT"


def publish(port: int, subject: str, *contents: str, retained: bool = False) -> list[int]:
    client = HttpClient(port)
    seqs = []
    for content in contents:
        status, body = client.publish(subject=subject, content=content, retained=retained)
        assert status == 200, body
        seqs.append(body["seq"])
    client.close()
    return seqs


def test_stream_ids_carry_every_subject_position(start_server: Any) -> None:
    server = start_server(BatchTime="0")
    publish(server.port, A, "a1", retained=True)
    stream = SseClient(server.port, [A, B])
    first = stream.events_until("subscribe")  # A's allow
    epoch = first[-1]["data"]["epoch"]
    assert first[-1]["id"].startswith(f"{epoch}:1,")
    snapshot = stream.next_event()
    assert snapshot
    assert (snapshot["data"]["type"], snapshot["data"]["content"]) == ("snapshot", "a1")
    stream.events_until("subscribe")  # B's allow
    publish(server.port, B, "b1")
    publish(server.port, A, "a2")
    b1, a2 = stream.next_event(), stream.next_event()
    assert b1 and a2
    b_epoch = b1["data"]["epoch"]
    assert b1["id"] == f"{epoch}:1,{b_epoch}:1"
    assert a2["id"] == f"{epoch}:2,{b_epoch}:1"
    stream.close()


def test_resume_with_last_event_id_gets_exactly_the_missed_messages(start_server: Any) -> None:
    server = start_server(BatchTime="0")
    publish(server.port, A, "1", "2")
    publish(server.port, B, "x")
    stream = SseClient(server.port, [A, B])
    stream.events_until("subscribe")
    stream.events_until("subscribe")
    publish(server.port, A, "3")
    events = stream.events_until("message")
    while not (events[-1]["event"] == "message" and events[-1]["data"]["content"] == "3"):
        events.append(stream.next_event())  # type: ignore[arg-type]
    last_id = stream.last_id
    stream.close()
    publish(server.port, A, "4", "5")
    publish(server.port, B, "y")
    resumed = SseClient(server.port, [A, B], last_event_id=last_id)
    got = resumed.events_until("sync") + resumed.events_until("sync")
    assert message_ids(got) == [("recovered", 4), ("recovered", 5), ("recovered", 2)]
    assert stats(server.port)["resumes"] == {"sync": 2}  # migratory_resumes_total
    assert [e["data"]["content"] for e in got if e["event"] == "message"] == ["4", "5", "y"]
    assert not any(e["data"].get("type") == "snapshot" for e in got)
    publish(server.port, A, "6")
    live = resumed.next_event()
    assert live and live["data"]["seq"] == 6 and live["data"]["type"] == "update"
    resumed.close()


def test_a_stream_cut_during_its_resume_still_resumes_every_subject(start_server: Any) -> None:
    # the first subject's resumed events carry the later subjects' positions too: cut
    # after A's sync, the browser's Last-Event-ID must still hold B's position, or B
    # would come back as a fresh subscribe without its missed messages and no resync
    server = start_server(BatchTime="0")
    publish(server.port, A, "1")
    publish(server.port, B, "x")
    stream = SseClient(server.port, [A, B])
    stream.events_until("subscribe")
    stream.events_until("subscribe")
    first_id = stream.last_id
    stream.close()
    publish(server.port, A, "2")
    publish(server.port, B, "y")
    resumed = SseClient(server.port, [A, B], last_event_id=first_id)
    resumed.events_until("sync")  # A's: its missed message, then the stream is cut
    cut_id = resumed.last_id
    resumed.close()
    assert cut_id is not None and first_id is not None
    assert cut_id.split(",")[1] == first_id.split(",")[1]  # B's position kept
    publish(server.port, B, "z")
    again = SseClient(server.port, [A, B], last_event_id=cut_id)
    got = again.events_until("sync") + again.events_until("sync")
    assert message_ids(got) == [("recovered", 2), ("recovered", 3)]
    assert [e["data"]["content"] for e in got if e["event"] == "message"] == ["y", "z"]
    again.close()


def test_an_unknown_or_unreadable_id_gives_the_snapshot_and_resync(start_server: Any) -> None:
    server = start_server(BatchTime="0")
    publish(server.port, A, "s1", "s2", retained=True)
    for last_id in ("12345:1", "garbage"):
        stream = SseClient(server.port, [A], last_event_id=last_id)
        got = stream.events_until("resync")
        assert [e["event"] for e in got] == ["subscribe", "message", "resync"], got
        assert got[1]["data"]["type"] == "snapshot" and got[1]["data"]["content"] == "s2"
        assert got[-1]["data"]["seq"] == 2
        stream.close()


def test_resume_past_the_cache_resyncs(start_server: Any) -> None:
    server = start_server(BatchTime="0", MaxCachedMessagesPerSubject="2")
    publish(server.port, A, "1", retained=True)
    stream = SseClient(server.port, [A])
    stream.events_until("message")
    last_id = stream.last_id
    stream.close()
    publish(server.port, A, "2", "3", "4", retained=True)
    got = SseClient(server.port, [A], last_event_id=last_id).events_until("resync")
    assert [e["event"] for e in got] == ["subscribe", "message", "resync"]
    assert got[1]["data"]["content"] == "4"
    assert stats(server.port)["resumes"] == {"resync": 1}


def test_idle_streams_get_heartbeat_comments(start_server: Any) -> None:
    server = start_server(SseHeartbeatInterval="1")
    asked = time.monotonic()  # the server's idle timer starts once it has read the request
    stream = SseClient(server.port, [A])
    stream.events_until("subscribe")
    block = stream.next_block(timeout=30)  # a hang guard, not the claim
    # the next thing on an idle stream is a heartbeat, and not before the interval (a
    # busy box only makes it later)
    assert block == b": heartbeat\n\n" and time.monotonic() - asked >= 1.0
    assert stream.next_block(timeout=30) == b": heartbeat\n\n"  # and again


def test_bad_stream_requests_are_refused(start_server: Any) -> None:
    server = start_server()
    client = HttpClient(server.port)
    for target in ("/events", "/events?subject=bad", f"/events?subject={A}&subject={A}"):
        response, _ = client.request("GET", target)
        assert response.status_code == 400, target
    client.close()


def _read_to_the_end(sock: socket.socket, chunks: list[bytes]) -> None:
    sock.settimeout(10)
    while chunk := sock.recv(1 << 20):  # the server closed it: the stream ends
        chunks.append(chunk)


def test_a_slow_reader_is_cut_off_and_others_keep_receiving(start_server: Any) -> None:
    server = start_server(BatchTime="0", ClientMaxPendingBytes="131072",
                          MaxMessageSize="65536")
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(("127.0.0.1", server.port))
    slow.sendall(f"GET /events?subject={A} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    fast = SseClient(server.port, [A])
    fast.events_until("subscribe")
    client = HttpClient(server.port)
    # Once cut off, the slow reader reads again at once: the server lingers
    # CLOSE_LINGER_SECONDS for it to take the close event queued behind the partly
    # written one, then gives up (it used to read after the loop: on a busy CI box more
    # than those 5 s later, and the close event was gone with the connection).
    chunks: list[bytes] = []
    reader: threading.Thread | None = None
    for i in range(400):  # 400 x 64 kB = 25.6 MB: far more than kernel buffers + limit
        client.publish(subject=A, content=f"{i:04d}" + "x" * 64_000)
        event = fast.next_event()
        assert event and event["data"]["seq"] == i + 1
        if reader is None and stats(server.port)["slow_consumers"] == 1:
            reader = threading.Thread(target=_read_to_the_end, args=(slow, chunks), daemon=True)
            reader.start()
    _, data = client.request("GET", "/stats")
    assert b'"slow_consumers": 1' in data, data
    assert reader is not None
    reader.join(30)
    received = b"".join(chunks)
    assert len(received) < 400 * 64_000
    assert b"event:close" in received and b'"code":4500' in received
    # what waited was dropped: the id a browser holds after the close event must be the
    # last message it got, or its resume skips the dropped ones without a resync
    held, last_seq = browser_id(received.partition(b"\r\n\r\n")[2])
    assert last_seq is not None and held == f"{server_epoch(server.port, A)}:{last_seq}"
    slow.close()


def browser_id(body: bytes) -> tuple[str | None, int | None]:
    """The last event id a browser holds after reading ``body`` (its complete events;
    the id buffer kept from event to event), and the seq of the last message in it."""
    held = buffer = None
    seq = None
    for block in body.split(b"\n\n")[:-1]:
        fields = [line.partition(b":") for line in block.split(b"\n") if line[:1] != b":"]
        values = {name: value for name, _, value in fields}
        buffer = values[b"id"].decode() if b"id" in values else buffer
        if b"data" in values:
            held = buffer
            if b"event" not in values:
                seq = json.loads(values[b"data"])["seq"]
    return held, seq


def server_epoch(port: int, subject: str) -> int:
    stream = SseClient(port, [subject])
    (allow,) = stream.events_until("subscribe")
    stream.close()
    return int(allow["data"]["epoch"])


def test_a_resume_past_the_client_limit_is_sent_whole_as_the_reader_takes_it(
    start_server: Any,
) -> None:
    """A resume whose missed messages pass ClientMaxPendingBytes (~12 kB against 4 kB)
    goes out as the socket drains: one connection gets all of it, then its sync. It
    used to be cut at the limit, the browser moving on a little at each reconnection
    (and never catching up behind a busy subject: test_sse_catch_up.py)."""
    server = start_server(BatchTime="0", ClientMaxPendingBytes="4096",
                          MaxMessageSize="2048")
    last, seqs = missed_after_first(server.port, 40)
    resumed = SseClient(server.port, [A], last_event_id=last)
    events = resumed.events_until("sync")
    resumed.close()
    assert [e["data"]["seq"] for e in events if e["event"] == "message"] == seqs
    assert stats(server.port)["slow_consumers"] == 0


def missed_after_first(port: int, count: int) -> tuple[str | None, list[int]]:
    """The id of a stream that got A's first message, then ``count`` messages of ~300
    bytes it missed (their seqs)."""
    publish(port, A, "first")
    stream = SseClient(port, [A])
    stream.events_until("subscribe")
    last = stream.last_id
    stream.close()
    return last, publish(port, A, *[f"{n:03d}" + "m" * 300 for n in range(count)])


def test_a_draining_server_tells_streams_to_reconnect_elsewhere(start_server: Any) -> None:
    server = start_server(DrainTime="5")
    stream = SseClient(server.port, [A])
    stream.events_until("subscribe")
    server.proc.send_signal(signal.SIGTERM)
    closing = stream.events_until("close", timeout=5)[-1]
    assert closing["data"]["code"] == 4502, closing
    assert server.proc.wait(10) == 0


def test_each_stream_gets_its_own_reconnect_delay(start_server: Any) -> None:
    """retry: 1000-1999 ms, drawn per stream: the streams of a member that goes away do
    not all come back in the same millisecond."""
    server = start_server()
    delays = []
    for _ in range(12):
        stream = SseClient(server.port, [A])
        block = stream.next_block()
        assert block is not None and block.startswith(b"retry:"), block
        delays.append(int(block[len(b"retry:"):]))
        stream.close()
    assert all(1000 <= d < 2000 for d in delays), delays
    assert len(set(delays)) > 1, delays


def test_a_token_that_expires_ends_streams_and_mqtt_sessions_too(
    start_server: Any, tmp_path: Path
) -> None:
    """Entitlement = Token: an SSE stream and an MQTT connection whose token expires are
    ended within a second (the stream with a ``close`` event 4503), as a native session
    is, instead of receiving for as long as they stay connected."""
    secret = "k" * 48
    key_file = tmp_path / "jwt.secret"
    key_file.write_text(secret)
    key_file.chmod(0o600)
    server = start_server(Entitlement="Token", EntitlementTokenKeyFile=str(key_file),
                          BatchTime="0", ListenMqtt="127.0.0.1:0")
    token = jwt.encode({"sub": "t", "exp": time.time() + 1.0, "subscribe": ["/Stocks/**"]},
                       secret, algorithm="HS256")
    stream = SseClient(server.port, [A], extra=f"&token={token}")
    stream.events_until("subscribe")
    device = MqttRawClient(server.mqtt_port)
    assert device.connect("dev", username="dev", password=token.encode()).return_code == 0
    assert device.subscribe("Stocks/+/IBM").return_codes == (0,)
    closed = stream.events_until("close", timeout=4.0)[-1]
    assert closed["data"]["code"] == close_codes.TOKEN_EXPIRED.code
    assert device.closed_by_server(timeout=3.0)
    stream.close()
    device.close()
    deadline = time.monotonic() + 3.0
    while (open_now := stats(server.port)["connections_open"]) > 1:  # /stats' own
        assert time.monotonic() < deadline, open_now
        time.sleep(0.05)


def literal_last_ids(blocks: list[bytes]) -> list[str]:
    """The browser's last event id after each dispatch, as the standard has it (WHATWG
    HTML, "interpreting an event stream"): each connection's id buffer starts empty, an
    ``id`` field sets it, and every blank line -- an event, a ``retry`` alone, a
    heartbeat comment -- sets the last event id to the buffer."""
    buffer, held = "", []
    for block in blocks:
        for line in block.split(b"\n"):
            name, _, value = line.partition(b":")
            if name == b"id":
                buffer = value.removeprefix(b" ").decode()
        held.append(buffer)
    return held


def test_a_resumed_stream_keeps_the_id_for_a_client_that_follows_the_standard(
    start_server: Any,
) -> None:
    """Resumed with nothing missed, the stream's first blocks are its retry and a
    heartbeat: after each, a client reading the standard to the letter must still hold
    the id it resumed from, or its next reconnect starts afresh past what it missed."""
    server = start_server(BatchTime="0", SseHeartbeatInterval="1")
    stream = SseClient(server.port, [A])
    stream.events_until("subscribe")
    publish(server.port, A, "1")
    assert stream.events_until("message")
    last_id = stream.last_id
    stream.close()
    resumed = SseClient(server.port, [A], last_event_id=last_id)
    blocks = [resumed.next_block(timeout=5)]
    for _ in range(20):  # up to the first heartbeat (1 s)
        if blocks[-1] in (None, b": heartbeat\n\n"):
            break
        blocks.append(resumed.next_block(timeout=5))
    resumed.close()
    assert blocks[-1] == b": heartbeat\n\n", blocks
    assert blocks[0].startswith(b"retry: ")
    held = literal_last_ids([b for b in blocks if b is not None])
    assert held == [last_id] * len(held), (blocks, held)
