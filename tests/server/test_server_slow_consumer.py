"""A client that stops reading is cut off; the others keep being served."""

from __future__ import annotations

import json
import threading
import urllib.request
from typing import Any

from rawclient import RawClient

from migratory.model.message import Message
from migratory.protocol import close_codes, ops
from migratory.protocol import websocket as ws

SUBJECT = "/Feed/Fast/Quotes"
COUNT = 400
CONTENT = b"x" * 64_000  # 400 x 64 kB = 25.6 MB: far more than kernel buffers + limit


def _stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats") as reply:
        result: dict[str, Any] = json.loads(reply.read())
        return result


def _read_close(client: RawClient, closes: list[ws.CloseReceived | BaseException]) -> None:
    try:
        closes.append(client.recv_close(timeout=20))
    except Exception as exc:  # (asserted in the test's thread)
        closes.append(exc)


def test_slow_consumer_is_cut_off_while_others_keep_up(start_server: Any) -> None:
    server = start_server(ClientMaxPendingBytes="262144", BatchTime="10",
                          OutboxMemoryBudget="1000000000")  # (for outbox_bytes)

    stuck = RawClient(server.port)
    stuck.connect("stuck")
    stuck.subscribe(SUBJECT)
    assert isinstance(stuck.recv_op(), ops.SubjectStatus)  # then it never reads again

    fast = RawClient(server.port)
    fast.connect("fast")
    fast.subscribe(SUBJECT)
    assert isinstance(fast.recv_op(), ops.SubjectStatus)

    # One publish at a time, each read by the fast subscriber before the next: whenever
    # the fast one has a message while the stuck one's bytes wait in its outbox and it
    # is not cut off yet, the fast one was served past the stuck one -- counted, not
    # timed (it asserted every latency under 2 s).
    publisher = RawClient(server.port)
    publisher.connect("publisher")
    served_past_the_stuck_one = 0
    # Once cut off, the stuck client reads again at once: the server lingers
    # CLOSE_LINGER_SECONDS for it to take the 4500 close frame queued behind the partly
    # written frame, then gives up (it used to read after the loop: on a busy box, more
    # than those 5 s later, and the close frame was gone with the connection).
    closes: list[ws.CloseReceived | BaseException] = []
    reader: threading.Thread | None = None
    for i in range(COUNT):
        status = publisher.publish(Message(SUBJECT, CONTENT, closure=str(i)))
        assert status.status is ops.Status.PUBLISH_OK
        (message,) = fast.recv_messages(1, timeout=30)  # a hang guard
        assert message.seq == i + 1  # every message reaches the reading subscriber
        stats = _stats(server.port)
        if not stats["slow_consumers"] and stats["outbox_bytes"] > 0:
            served_past_the_stuck_one += 1
        if stats["slow_consumers"] and reader is None:
            reader = threading.Thread(target=_read_close, args=(stuck, closes), daemon=True)
            reader.start()
    # (62-65 of 400 here: the stuck one's kernel buffers full, its outbox filling)
    assert served_past_the_stuck_one >= 2, served_past_the_stuck_one
    assert _stats(server.port)["slow_consumers"] == 1
    assert "slow consumer cut off" in server.log()
    # Reading again, the stuck client got what the kernel held, then the 4500 close
    # frame the server queued behind the partially written frame.
    assert reader is not None
    reader.join(30)
    (close,) = closes
    assert isinstance(close, ws.CloseReceived), close
    assert close.code == close_codes.SLOW_CONSUMER.code
    assert close_codes.SLOW_CONSUMER.reconnect
