"""The Raft port's front on real sockets (cluster/raft_front_server.py): pysyncobj gets a
connection -- a ``TcpConnection`` -- only after its preamble proved the password.

Real pysyncobj on loopback, ticked by the test (``autoTick=False``) except for the seeds of
:func:`test_three_seeds_link_through_the_front_elect_commit_and_fail_over`. Every
``TcpConnection`` built for an accepted socket is counted (raft_port_probe.py ``incoming``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import inspect
import logging
import os
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from listen_ports import listen_port
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.monotonic import monotonic
from pysyncobj.poller import createPoller
from pysyncobj.tcp_connection import TcpConnection
from pysyncobj.tcp_server import TcpServer
from pysyncobj.transport import TCPTransport
from raft_port_probe import count_incoming

from cluster.coordination import CommittedBatch
from cluster.raft import RaftCoordination
from cluster.raft_front import (
    NONCE_SIZE,
    PREAMBLE_SIZE,
    PreambleGate,
    derive_key,
    encode_preamble,
)
from cluster.raft_front_server import MAX_PENDING
from cluster.raft_transport import UNAUTHENTICATED_SECONDS, SeedLinkTransport

PASSWORD = "cluster-password"


def conf(**extra: object) -> SyncObjConf:
    return SyncObjConf(
        password=PASSWORD, autoTick=False, raftMinTimeout=0.15, raftMaxTimeout=0.3,
        appendEntriesPeriod=0.04, connectionTimeout=1.0, connectionRetryTime=0.3,
        maxBindRetries=3, bindRetryTime=0.1, **extra,
    )


def free_port() -> int:
    return listen_port()  # below the ephemeral range: see listen_ports.py


@pytest.fixture
def incoming(monkeypatch: pytest.MonkeyPatch) -> list[TcpConnection]:
    return count_incoming(monkeypatch)


@pytest.fixture
def seed() -> Iterator[tuple[SyncObj, str]]:
    port = free_port()
    address = f"127.0.0.1:{port}"
    node = SyncObj(address, [], conf=conf(), transportClass=SeedLinkTransport)
    try:
        tick(node, 0.2)
        yield node, address
    finally:
        node.destroy()


def tick(node: SyncObj, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        node.doTick(0.01)


def closed_within(node: SyncObj, sock: socket.socket, seconds: float) -> int | None:
    """Ticks ``node`` until the peer sees ``sock`` closed: how many ticks that took (None
    if not within ``seconds``, a hang guard)."""
    sock.settimeout(0)
    began = time.monotonic()
    ticks = 0
    while time.monotonic() < began + seconds:
        node.doTick(0.01)
        ticks += 1
        try:
            if sock.recv(1 << 16) == b"":
                return ticks
        except BlockingIOError:
            continue
        except ConnectionResetError:
            return ticks
    return None


def connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def valid_preamble(address: str, password: str = PASSWORD) -> bytes:
    return encode_preamble(derive_key(password), target=address, now=time.time(),
                           nonce=os.urandom(NONCE_SIZE))


def test_a_garbage_peer_never_reaches_pysyncobj(
    seed: tuple[SyncObj, str], incoming: list[TcpConnection]
) -> None:
    node, address = seed
    with connect(address) as sock:
        sock.sendall(os.urandom(1 << 16))  # no label: refused at its first byte
        ticks = closed_within(node, sock, 30.0)
    # refused at its first byte: the tick that reads it, not the unauthenticated timeout
    assert ticks is not None and ticks <= 3, ticks
    assert incoming == []


def test_a_preamble_sealed_with_another_password_is_refused(
    seed: tuple[SyncObj, str], incoming: list[TcpConnection]
) -> None:
    node, address = seed
    with connect(address) as sock:
        sock.sendall(valid_preamble(address, "not the password") + b"\x10\x00\x00\x00" * 8)
        assert closed_within(node, sock, 30.0) is not None
    assert incoming == []


def test_a_replayed_preamble_is_refused(
    seed: tuple[SyncObj, str], incoming: list[TcpConnection]
) -> None:
    node, address = seed
    captured = valid_preamble(address)
    with connect(address) as first:
        first.sendall(captured)
        tick(node, 0.2)
        assert len(incoming) == 1  # the seed's own connection reaches pysyncobj
        with connect(address) as replay:
            replay.sendall(captured)
            assert closed_within(node, replay, 30.0) is not None
    assert len(incoming) == 1


def test_an_idle_connection_is_closed_before_pysyncobj_sees_it(
    seed: tuple[SyncObj, str], incoming: list[TcpConnection]
) -> None:
    node, address = seed
    with connect(address) as idle, connect(address) as almost:
        almost.sendall(valid_preamble(address)[: PREAMBLE_SIZE - 1])  # one byte short
        for _ in range(3):  # the node accepts both (their deadlines are before ``due``)
            node.doTick(0.01)
        due = time.monotonic() + UNAUTHENTICATED_SECONDS
        while time.monotonic() < due:
            node.doTick(0.01)
        # closed by the first tick past their deadline (ticks counted, not seconds)
        idle_ticks = closed_within(node, idle, 30.0)
        almost_ticks = closed_within(node, almost, 30.0)
        assert idle_ticks is not None and idle_ticks <= 2, idle_ticks
        assert almost_ticks is not None and almost_ticks <= 2, almost_ticks
    assert incoming == []


def test_connections_waiting_for_a_preamble_are_bounded(
    seed: tuple[SyncObj, str], incoming: list[TcpConnection]
) -> None:
    node, address = seed
    idle = []
    try:
        for _ in range(MAX_PENDING + 20):
            idle.append(connect(address))
            node.doTick(0.002)  # accepts only while ticked
        tick(node, 0.3)
        stats = node._SyncObj__transport.front_statistics()
        assert stats.pending == MAX_PENDING
        assert stats.evicted == 20
        with connect(address) as late:  # a newcomer still gets its turn
            late.sendall(valid_preamble(address))
            tick(node, 0.2)
        assert len(incoming) == 1
    finally:
        for sock in idle:
            sock.close()


def test_every_refusal_is_logged_saying_why_once_per_kind(
    seed: tuple[SyncObj, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Garbage, a wrong password and MAX_PENDING reached, each five times: one warning
    per kind, naming why and from where (before: garbage and a wrong password at DEBUG,
    an eviction not at all)."""
    caplog.set_level(logging.INFO, logger="migratory.raft")
    node, address = seed
    garbage = b"\xff" + os.urandom(63)  # \xff: never the label's first byte
    for data in [garbage] * 5 + [valid_preamble(address, "not the password")] * 5:
        with connect(address) as sock:
            sock.sendall(data)
            assert closed_within(node, sock, 30.0) is not None
    idle = []
    try:
        for _ in range(MAX_PENDING + 5):
            idle.append(connect(address))
            node.doTick(0.002)
        tick(node, 0.2)
    finally:
        for sock in idle:
            sock.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        "Raft port: refused a connection from 127.0.0.1: it sent something other than a "
        "seed's preamble (not a seed, or a seed of another migratory version)",
        "Raft port: refused a connection from 127.0.0.1: its preamble was made with "
        "another password (or for another seed)",
        f"Raft port: refused a connection from 127.0.0.1: {MAX_PENDING} connections "
        "waiting for their preamble (MAX_PENDING): the oldest closed",
    ]


def test_a_seed_is_not_kept_waiting_behind_a_burst_of_connections(
    seed: tuple[SyncObj, str], incoming: list[TcpConnection]
) -> None:
    """100 peers connect between two ticks, then a seed: within a few polls it reaches
    pysyncobj (TcpServer: a backlog of 5, one accept per poll)."""
    node, address = seed
    burst = [connect(address) for _ in range(100)]
    try:
        with connect(address) as late:
            late.sendall(valid_preamble(address))
            for _ in range(12):
                node.doTick(0.01)
            assert len(incoming) == 1
    finally:
        for sock in burst:
            sock.close()


def test_a_seed_outlives_idle_connections_from_many_addresses(
    seed: tuple[SyncObj, str], incoming: list[TcpConnection]
) -> None:
    """No per-address fairness is needed here: idle connections from 20 addresses in
    turn, MAX_PENDING + 60 of them, a seed's dial in their midst: MAX_PENDING closes
    the oldest, and a seed, whose preamble comes with its connect, is never the
    oldest long enough, whatever the number of addresses (nothing here costs more per
    connection than its accept and close)."""
    node, address = seed
    host, port = address.rsplit(":", 1)
    idle = []
    try:
        for n in range(MAX_PENDING + 60):
            idle.append(socket.create_connection((host, int(port)), timeout=5,
                                                 source_address=(f"127.0.0.{2 + n % 20}", 0)))
            node.doTick(0.002)
            if n == MAX_PENDING:
                dial = connect(address)
                dial.sendall(valid_preamble(address))
                idle.append(dial)
        tick(node, 0.2)
        assert node._SyncObj__transport.front_statistics().evicted >= 60
        assert len(incoming) == 1
    finally:
        for sock in idle:
            sock.close()


def test_a_dialling_seed_writes_its_preamble_first() -> None:
    """Seed B dials A (pysyncobj: the greater address dials); what A's port receives
    first is a preamble for A, then pysyncobj's first frame."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        a_address = f"127.0.0.1:{listener.getsockname()[1]}"
        b = SyncObj(f"127.0.0.2:{free_port()}", [a_address], transportClass=SeedLinkTransport,
                    conf=conf(bindAddress="127.0.0.2:0"))
        try:
            b._SyncObj__transport._connectIfNecessary()
            accepted, _ = listener.accept()
            with accepted:
                accepted.settimeout(0)
                received = b""
                deadline = time.monotonic() + 2
                while len(received) < PREAMBLE_SIZE + 4 and time.monotonic() < deadline:
                    b.doTick(0.01)
                    with contextlib.suppress(BlockingIOError):
                        received += accepted.recv(1024)
        finally:
            b.destroy()
    gate = PreambleGate(derive_key(PASSWORD), address=a_address)
    assert gate.verify(received[:PREAMBLE_SIZE], time.time()).admitted
    assert len(received) > PREAMBLE_SIZE  # pysyncobj's own bytes follow


ACCEPT_PATH = "eb2f93a2"
CREATE_SERVER = "df2c7dd8"


def digest(function: Any) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:8]


def test_canary_the_pysyncobj_code_the_front_stands_in_for() -> None:
    """FrontServer does what TcpServer's accept does, SeedLinkTransport._createServer what
    TCPTransport's does, and the preamble goes into TcpConnection's write buffer. If this
    fails, pysyncobj changed: re-check cluster/raft_front_server.py and raft_transport.py."""
    assert digest(TcpServer._TcpServer__onNewConnection) == ACCEPT_PATH
    assert digest(TCPTransport._createServer) == CREATE_SERVER
    connect_source = inspect.getsource(TcpConnection.connect)
    assert "self.__writeBuffer = bytes()" in connect_source
    conn = TcpConnection(poller=createPoller("auto"))
    conn.send("m")  # not connected: queued
    assert zlib.decompress(conn._TcpConnection__writeBuffer[4:])  # the frame is there


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.slow
def test_three_seeds_link_through_the_front_elect_commit_and_fail_over(
    incoming: list[TcpConnection],
) -> None:
    # RaftCoordination binds only the Raft port, the cluster port + 1
    addresses = [("127.0.0.1", free_port() - 1) for _ in range(3)]
    committed: list[list[CommittedBatch]] = [[], [], []]
    seeds = [
        RaftCoordination(self_address=a, seed_addresses=addresses, password=PASSWORD,
                         on_commit=committed[i].append)
        for i, a in enumerate(addresses)
    ]
    alive = list(range(3))
    try:
        def leader() -> int | None:
            leaders = {seeds[i].snapshot.leader for i in alive}
            if len(leaders) != 1 or None in leaders:
                return None
            (address,) = leaders  # None while the survivors still name the one closed
            return next((i for i in alive if seeds[i].address == address), None)

        def commit_everywhere(count: int) -> None:
            wait_for(lambda: leader() is not None, 15, "no leader")
            done = threading.Event()
            seeds[leader()].submit(2, [], lambda *_: done.set())  # type: ignore[index]
            assert done.wait(10), "no commit"
            wait_for(lambda: all(len(committed[i]) >= count for i in alive), 10,
                     "not applied everywhere")

        commit_everywhere(1)
        # every link came through the front: as many TcpConnections as it admitted, and
        # /cluster says so (raft_front, published by the Raft thread every 50 ms)
        def admitted() -> int:
            return sum(int(s.status()["raft_front"]["admitted"]) for s in seeds)

        wait_for(lambda: admitted() == len(incoming) >= 3, 2, "links not through the front")
        first = leader()
        assert first is not None
        seeds[first].close()
        alive.remove(first)
        commit_everywhere(2)
        assert leader() != first
    finally:
        for i in alive:
            seeds[i].close()


class _FlakyListener:
    """A listening socket whose first accept fails as ``errors`` say, then works."""

    def __init__(self, real: socket.socket, errors: list[OSError]) -> None:
        self._real = real
        self._errors = errors

    def accept(self) -> tuple[socket.socket, Any]:
        if self._errors:
            raise self._errors.pop(0)
        return self._real.accept()

    def fileno(self) -> int:
        return self._real.fileno()

    def close(self) -> None:
        self._real.close()


def front_server(poller: Any) -> Any:
    from cluster.raft_front_server import FrontServer

    server = FrontServer(
        poller, "127.0.0.1", free_port(), lambda connection: None,
        gate=PreambleGate(b"k" * 32, address="127.0.0.1:1"),
        send_buffer_size=2**16, recv_buffer_size=2**16, connection_timeout=3.0,
    )
    server.bind()
    return server


def test_a_connection_aborted_before_accept_does_not_stop_the_listener() -> None:
    """Only a failure of the listener itself makes it listen again later; a peer that
    connected and reset before it was accepted is skipped (it was unbound)."""
    server = front_server(createPoller("auto"))
    try:
        assert server._socket is not None
        real = server._socket
        server._socket = _FlakyListener(real, [ConnectionAbortedError(103, "aborted")])
        with socket.create_connection(("127.0.0.1", server._port)):
            time.sleep(0.05)
            server._on_accept(server.fileno or 0, 1)  # POLL_EVENT_TYPE.READ
            assert server.fileno is not None, "the listener was dropped"
            assert server.statistics().pending == 1, "the next connection was taken"
        server._socket = _FlakyListener(real, [OSError(errno.EINVAL, "Invalid argument")])
        server._on_accept(server.fileno, 1)
        assert server.fileno is None  # unbound, the transport binds again
    finally:
        server.close_waiting()
        server.unbind()


class _Polled:
    """pysyncobj's poller, remembering which descriptors it polls."""

    def __init__(self) -> None:
        self.real = createPoller("auto")
        self.polled: set[int] = set()

    def subscribe(self, fileno: int, callback: Any, events: int) -> None:
        self.polled.add(fileno)
        self.real.subscribe(fileno, callback, events)

    def unsubscribe(self, fileno: int) -> None:
        self.polled.discard(fileno)
        self.real.unsubscribe(fileno)


def test_no_descriptor_left_pauses_the_listener_says_so_once_then_accepts_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """EMFILE: the listener stays bound (its backlog kept) but is not polled until the
    pause is over (a polled one wakes every poll, its accept failing at once); 50
    failures make one line, and one more once a connection is accepted. pysyncobj's
    TcpServer (and this front before) unbound it, to bind it again a second later, two
    warnings per round."""
    caplog.set_level(logging.INFO, logger="migratory.raft")
    poller = _Polled()
    server = front_server(poller)
    try:
        real = server._socket
        emfile = [OSError(errno.EMFILE, "Too many open files") for _ in range(50)]
        server._socket = _FlakyListener(real, emfile)
        listener = server.fileno
        with socket.create_connection(("127.0.0.1", server._port)):
            time.sleep(0.05)
            for _ in range(50):
                server._on_accept(listener, 1)
                assert server.fileno == listener, "unbound: its backlog reset"
                assert listener not in poller.polled, "still polled: woken every poll"
                server.resume(monotonic())  # the pause is not over
                assert listener not in poller.polled
                server.resume(monotonic() + 1.0)
                assert listener in poller.polled
            server._on_accept(listener, 1)
            assert server.statistics().pending == 1, "the waiting connection was not taken"
    finally:
        server.close_waiting()
        server.unbind()
    lines = [r.getMessage() for r in caplog.records if r.name == "migratory.raft"]
    assert len(lines) == 2, lines
    assert "cannot accept a connection: EMFILE" in lines[0] and "ulimit -n" in lines[0]
    assert "working again after 50 failures" in lines[1]
    assert not any(r.exc_info for r in caplog.records)


def test_a_connection_has_its_time_whatever_time_monotonic_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``expire`` is given pysyncobj's clock (CLOCK_MONOTONIC_RAW); an arrival stamped
    with ``time.monotonic`` (NTP-slewed: the two part by a few ppm of the uptime) was
    off by their gap: 10 s closed every connection at the first tick, before its
    preamble could be read (3 s would have been enough)."""
    server = front_server(createPoller("auto"))
    try:
        with socket.create_connection(("127.0.0.1", server._port)):
            time.sleep(0.05)
            real = time.monotonic
            monkeypatch.setattr(time, "monotonic", lambda: real() - 10.0)
            server._on_accept(server.fileno, 1)
            monkeypatch.undo()
            server.expire(monotonic())
            assert server.statistics().pending == 1
            assert server.statistics().timed_out == 0
            server.expire(monotonic() + UNAUTHENTICATED_SECONDS + 0.5)
            assert server.statistics().timed_out == 1
    finally:
        server.close_waiting()
        server.unbind()
