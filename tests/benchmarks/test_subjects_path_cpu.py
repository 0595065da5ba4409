"""benchmarks/subjects_path_cpu.py: its in-process many-subjects path writes every publish
to its subscriber, one write each, and acknowledges every publish."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from subjects_path_cpu import build, publish, publish_chunks

from migratory.protocol import ops


def test_every_publish_is_written_to_its_subscriber_and_acknowledged() -> None:
    server, publisher, subscribers, mask = build(50)
    writes = [c.sock.writes for c in subscribers]  # type: ignore[attr-defined]
    before = publisher.sock.sent  # type: ignore[attr-defined]
    # 50 subjects at 1,000 msg/s: a message per subscriber every 50 ms, idle each time
    publish(server, publisher, publish_chunks(200, 50, 16, mask), 1_000, None)
    after = [c.sock.writes for c in subscribers]  # type: ignore[attr-defined]
    assert [a - b for a, b in zip(after, writes, strict=True)] == [4] * 50
    assert server.ctx.stats.publishes_received == 200
    assert server.ctx.stats.publishes_refused == 0
    assert not publisher.session.outbox
    one_ack = len(ops.encode_publish_ok("0", "/bench/s/0", 1, 1)) + 2  # + the frame header
    assert publisher.sock.sent - before >= 200 * one_ack  # type: ignore[attr-defined]
