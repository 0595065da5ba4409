"""Server-Sent Events against a real Guaranteed cluster: the stream's member is
SIGKILLed while messages are published; the stream reconnects to another member
with its Last-Event-ID and gets exactly the missed messages, then `sync`."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from cluster_fixture import LocalCluster
from test_cluster_processes import SUBJECT, Publisher

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from httpclient import HttpClient, SseClient


def resume(port: int, last_id: str | None, attempts: int = 10) -> SseClient:
    """The stream again with ``Last-Event-ID``, as a client following ``Retry-After``
    does: a member that is briefly not ready (its upstream seed or the Raft leader just
    went away) answers 503 with ``Retry-After: 1``."""
    for _ in range(attempts):
        stream = SseClient(port, [SUBJECT], last_event_id=last_id)
        if stream.wait_head() != 503:
            return stream
        stream.close()
        time.sleep(1.0)
    raise AssertionError(f"the member on port {port} was not ready after {attempts} tries")


def test_sse_stream_resumes_on_another_member_without_gap_or_duplicate(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=4, seeds=3)
    cluster.start_all()
    try:
        cluster.wait_ready()
        stream = SseClient(cluster.port(1), [SUBJECT])
        assert stream.events_until("subscribe")
        pub = Publisher(cluster, 2, count=100, pause=0.01)
        pub.start()
        events: list[dict[str, Any]] = []
        while len([e for e in events if e["event"] == "message"]) < 25:
            event = stream.next_event(timeout=10)
            assert event is not None, events
            events.append(event)
        last_id = stream.last_id
        cluster.kill(1)
        stream.close()
        time.sleep(0.3)
        resumed = resume(cluster.port(3), last_id)
        after = resumed.events_until("sync", timeout=15)
        assert not any(e["event"] == "resync" for e in after), after
        pub.finish(60)
        acked = [content.decode() for content, _ in pub.acked]
        deadline = time.monotonic() + 20
        got = [e for e in events + after if e["event"] == "message"]
        while {e["data"]["content"] for e in got} < set(acked) and time.monotonic() < deadline:
            event = resumed.next_event(timeout=2)
            if event is not None and event["event"] == "message":
                got.append(event)
        seqs = [e["data"]["seq"] for e in got]
        assert seqs == sorted(set(seqs)), "duplicate or reordered event"
        assert [e["data"]["content"] for e in got] == acked[: len(got)]
        assert len(got) == len(acked) >= 95
        assert {e["data"]["type"] for e in after if e["event"] == "message"} <= {"recovered"}
        status, body = HttpClient(cluster.port(3)).publish(subject=SUBJECT, content="http")
        assert status == 200 and body["seq"] == seqs[-1] + 1
        live = resumed.next_event(timeout=10)
        assert live and live["data"]["content"] == "http" and live["id"].endswith(
            f":{seqs[-1] + 1}")
    finally:
        cluster.stop()
