"""SendPath = io_uring (migratory/server/uring_writer.py): every byte, in order, each
completion told once; and a real server writing through it -- fan-out exact, a slow
consumer cut off, a reader that vanishes mid-stream -- or falling back to send() where
io_uring cannot be had. Skipped, with the reason, where the kernel refuses io_uring."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from mqttclient import stats
from rawclient import RawClient
from test_connection_churn import require_io_uring, settled_fds

from migratory.model.message import Message
from migratory.protocol import ops
from migratory.server.uring_writer import UringUnavailable, UringWriter, open_send_path


@pytest.fixture
def writer() -> Iterator[UringWriter]:
    try:
        opened = UringWriter.open()
    except UringUnavailable as exc:
        pytest.skip(f"io_uring not available here: {exc}")
    yield opened
    opened.close()


class Owner:
    def __init__(self) -> None:
        self.completions: list[tuple[bytes, int]] = []

    def sent(self, batch: bytes, result: int) -> None:
        self.completions.append((batch, result))


def reap_until(writer: UringWriter, count: int, owners: list[Owner]) -> None:
    deadline = time.monotonic() + 5
    while sum(len(o.completions) for o in owners) < count:
        assert time.monotonic() < deadline, "completions missing"
        writer.reap()
        time.sleep(0.001)


def test_every_batch_arrives_whole_in_order_and_completes_once(writer: UringWriter) -> None:
    pairs = [socket.socketpair() for _ in range(8)]
    for ours, _theirs in pairs:
        ours.setblocking(False)
    owners = [Owner() for _ in pairs]
    expected = [b"" for _ in pairs]
    for round_no in range(50):
        writer.hold()  # one submission for the eight sends
        for index, (ours, _theirs) in enumerate(pairs):
            batch = f"{index}:{round_no};".encode() * (1 + round_no % 7)
            writer.send(ours.fileno(), batch, owners[index])
            expected[index] += batch
        writer.release()
        reap_until(writer, 8 * (round_no + 1), owners)
    for index, (_ours, theirs) in enumerate(pairs):
        received = b""
        while len(received) < len(expected[index]):
            received += theirs.recv(65536)
        assert received == expected[index]
        assert [result for _batch, result in owners[index].completions] == [
            len(batch) for batch, _result in owners[index].completions]
    assert writer.in_flight == 0 and writer.sends == 400


def test_a_second_send_in_flight_on_one_fd_is_refused(writer: UringWriter) -> None:
    ours, _theirs = socket.socketpair()
    owner = Owner()
    writer.hold()  # not submitted yet: certainly in flight
    writer.send(ours.fileno(), b"one", owner)
    with pytest.raises(RuntimeError, match="second send in flight"):
        writer.send(ours.fileno(), b"two", owner)
    writer.release()
    reap_until(writer, 1, [owner])
    assert owner.completions == [(b"one", 3)]


def test_a_failing_owner_does_not_stop_the_others(
    writer: UringWriter, caplog: pytest.LogCaptureFixture
) -> None:
    class Failing(Owner):
        def sent(self, batch: bytes, result: int) -> None:
            raise ValueError("this connection's bug")

    pairs = [socket.socketpair() for _ in range(3)]
    owners = [Owner(), Failing(), Owner()]
    writer.hold()
    for (ours, _theirs), owner in zip(pairs, owners, strict=True):
        writer.send(ours.fileno(), b"x", owner)
    writer.release()
    with caplog.at_level(logging.ERROR, logger="migratory.uring"):
        deadline = time.monotonic() + 5
        while len(owners[0].completions) + len(owners[2].completions) < 2:
            assert time.monotonic() < deadline
            writer.reap()
            time.sleep(0.001)
    assert "completion failed" in caplog.text and writer.in_flight == 0


def test_a_send_to_a_closed_peer_completes_with_an_error(writer: UringWriter) -> None:
    ours, theirs = socket.socketpair()
    theirs.close()
    owner = Owner()
    writer.send(ours.fileno(), b"lost", owner)
    reap_until(writer, 1, [owner])
    [(_batch, result)] = owner.completions
    assert result < 0  # -EPIPE: the connection aborts


def test_the_completions_wake_the_writer_task(writer: UringWriter) -> None:
    ours, theirs = socket.socketpair()
    owner = Owner()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            writer.send(ours.fileno(), b"wake", owner)
            with trio.fail_after(5):
                while not owner.completions:
                    await trio.sleep(0.001)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert owner.completions == [(b"wake", 4)] and theirs.recv(10) == b"wake"


def test_where_io_uring_is_refused_the_server_writes_with_send(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(**_options: float) -> UringWriter:
        raise UringUnavailable("io_uring_setup: Operation not permitted")

    monkeypatch.setattr(UringWriter, "open", staticmethod(refuse))
    with caplog.at_level(logging.WARNING, logger="migratory.uring"):
        assert open_send_path("io_uring") is None
    assert "SendPath = io_uring is not available here (io_uring_setup: Operation not " \
        "permitted): writing with send()" in caplog.text
    assert open_send_path("socket") is None


def test_a_server_writing_through_io_uring_delivers_every_message_in_order(
    start_server: Any,
) -> None:
    server = start_server(SendPath="io_uring")
    require_io_uring(server)
    subscribers = []
    for n in range(20):
        client = RawClient(server.port)
        client.connect(f"s{n}")
        client.subscribe(f"/uring/{n % 4}")
        client.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW)
        subscribers.append(client)
    publisher = RawClient(server.port)
    publisher.connect("publisher")
    for seq in range(1, 201):
        for subject in range(4):
            status = publisher.publish(
                Message(f"/uring/{subject}", b"m%d" % seq * 40, closure=f"{subject}-{seq}"))
            assert status.position is not None and status.position.seq == seq
    for n, client in enumerate(subscribers):
        messages = client.recv_messages(200, timeout=10)
        assert [m.seq for m in messages] == list(range(1, 201)), n
        assert all(m.content == b"m%d" % m.seq * 40 for m in messages)
    assert stats(server.port)["slow_consumers"] == 0


def test_through_io_uring_a_slow_consumer_is_cut_off_and_the_others_carry_on(
    start_server: Any,
) -> None:
    server = start_server(SendPath="io_uring", ClientMaxPendingBytes="1048576")
    require_io_uring(server)
    fds = settled_fds(server.proc.pid)
    stuck = RawClient(server.port)
    stuck.connect("stuck")
    stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.subscribe("/uring/slow")
    stuck.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW)
    reader = RawClient(server.port, timeout=20)
    reader.connect("reader")
    reader.subscribe("/uring/slow")
    reader.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW)
    vanishing = RawClient(server.port)
    vanishing.connect("vanishing")
    vanishing.subscribe("/uring/slow")
    vanishing.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW)
    publisher = RawClient(server.port, timeout=20)
    publisher.connect("publisher")
    for seq in range(1, 201):  # 12.8 MB: more than the kernel's buffers and 1 MiB queued
        publisher.publish(Message("/uring/slow", b"z" * 64_000, closure=str(seq)))
        [message] = reader.recv_messages(1)
        assert message.seq == seq  # the reader keeps up and misses nothing
        if seq == 10:
            vanishing.sock.close()  # mid-stream, with sends to it in flight or queued
    figures = stats(server.port)
    assert figures["slow_consumers"] == 1
    deadline = time.monotonic() + 10
    while stats(server.port)["connections_open"] > 3:  # publisher, reader, this request
        assert time.monotonic() < deadline, stats(server.port)
        time.sleep(0.1)
    # the stuck client still holds its end open, and the server's send to it waited for
    # room: cut off, its socket is closed all the same (the send ends when it is shut down)
    assert settled_fds(server.proc.pid, fds + 2) <= fds + 2  # the publisher's and reader's
