"""A client that stops reading is cut off; the others keep being served."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

from rawclient import RawClient

from migratory.model.message import Message
from migratory.protocol import close_codes, ops

SUBJECT = "/Feed/Fast/Quotes"
COUNT = 400
CONTENT = b"x" * 64_000  # 400 x 64 kB = 25.6 MB: far more than kernel buffers + limit


def _stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats") as reply:
        result: dict[str, Any] = json.loads(reply.read())
        return result


def test_slow_consumer_is_cut_off_while_others_keep_up(start_server: Any) -> None:
    server = start_server(ClientMaxPendingBytes="262144", BatchTime="10")

    stuck = RawClient(server.port)
    stuck.connect("stuck")
    stuck.subscribe(SUBJECT)
    assert isinstance(stuck.recv_op(), ops.SubjectStatus)  # then it never reads again

    fast = RawClient(server.port)
    fast.connect("fast")
    fast.subscribe(SUBJECT)
    assert isinstance(fast.recv_op(), ops.SubjectStatus)

    sent_at: dict[int, float] = {}
    latencies: list[float] = []

    def read_all() -> None:
        for message in fast.recv_messages(COUNT, timeout=20):
            latencies.append(time.monotonic() - sent_at[message.seq])

    reader = threading.Thread(target=read_all)
    publisher = RawClient(server.port)
    publisher.connect("publisher")
    reader.start()
    for i in range(COUNT):
        sent_at[i + 1] = time.monotonic()
        status = publisher.publish(Message(SUBJECT, CONTENT, closure=str(i)))
        assert status.status is ops.Status.PUBLISH_OK
    reader.join(30)
    assert not reader.is_alive()

    assert len(latencies) == COUNT  # every message reached the reading subscriber
    assert max(latencies) < 2.0  # never stuck behind the slow one (generous bound)
    assert _stats(server.port)["slow_consumers"] == 1
    assert "slow consumer cut off" in server.log()
    # Reading again, the stuck client gets what the kernel held, then the 4500 close
    # frame the server queued behind the partially written frame.
    close = stuck.recv_close(timeout=10)
    assert close.code == close_codes.SLOW_CONSUMER.code
    assert close_codes.SLOW_CONSUMER.reconnect
