"""The sequencer of a server with workers: one numbering for every worker (no sockets;
the processes are in test_workers.py)."""

from __future__ import annotations

import trio

from cluster import link
from cluster.coordination import PublishRequest
from cluster.sequencer import Sequencer
from cluster.stream import Outbound, wire_bytes
from cluster.workers import monitor_override
from migratory.config import Config
from migratory.model.message import Message

IBM, AAPL = "/Stocks/NYSE/IBM", "/Stocks/NASDAQ/AAPL"


def ops_of(receive: trio.MemoryReceiveChannel[Outbound]) -> list[link.LinkOp]:
    out = []
    while True:
        try:
            out.append(link.decode_op(wire_bytes(receive.receive_nowait())[4:]))
        except trio.WouldBlock:
            return out


def request(origin: str, ref: int, subject: str) -> PublishRequest:
    return PublishRequest(origin, ref, Message(subject, f"{origin}/{ref}".encode()))


def test_publishes_from_any_worker_are_numbered_once_and_sent_to_every_worker() -> None:
    async def main() -> None:
        sequencer = Sequencer(Config.defaults(), workers=2, password="p" * 16)
        queues = [trio.open_memory_channel[Outbound](100) for _ in range(2)]
        for index, (send, _) in enumerate(queues):
            sequencer.stream.follow(f"worker-{index}", 0, False, send)
        sequencer.take_forward("worker-0", [request("w0", 1, IBM), request("w0", 2, AAPL)])
        sequencer.take_forward("worker-1", [request("w1", 1, IBM)])
        seen = []
        for _, receive in queues:
            batches = [op.batch for op in ops_of(receive) if isinstance(op, link.Batch)]
            seen.append(batches)
            assert [b.clsn for b in batches] == [1, 2]
            assert batches[1].origins == (("w1", 1),)  # the worker acknowledges its own
        assert seen[0] == seen[1], "workers were sent different numberings"
        ibm = [m for b in seen[0] for m in b.messages if m.subject == IBM]
        assert [m.seq for m in ibm] == [1, 2] and ibm[0].epoch == ibm[1].epoch
        # a worker (re)started later is caught up with the same batches
        late_send, late_receive = trio.open_memory_channel[Outbound](100)
        sequencer.stream.follow("worker-1", 0, False, late_send)
        assert [op.batch for op in ops_of(late_receive) if isinstance(op, link.Batch)] == seen[0]

    trio.run(main)


def test_each_worker_gets_its_own_monitoring_port() -> None:
    config = Config.from_mapping({"MonitorListen": "127.0.0.1:9700", "Workers": "3"})
    assert [monitor_override(config, i) for i in range(3)] == [
        {"MonitorListen": "127.0.0.1:9700"},
        {"MonitorListen": "127.0.0.1:9701"},
        {"MonitorListen": "127.0.0.1:9702"},
    ]
    zero = Config.from_mapping({"MonitorListen": "127.0.0.1:0", "Workers": "3"})
    assert monitor_override(zero, 2) == {}  # each picks its own free port
