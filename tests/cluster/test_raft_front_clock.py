"""The Raft port's front and the clocks (cluster/raft_front_server.py, its clock injected):
a seed whose clock is off, and this seed's clock going back, are said in the log and in
``GET /cluster``'s ``raft_front``. The gate's own rules: tests/cluster/test_raft_front.py."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

import pytest
from listen_ports import listen_port
from pysyncobj.poller import createPoller
from pysyncobj.tcp_connection import TcpConnection

from cluster.raft_front import NONCE_SIZE, PreambleGate, derive_key, encode_preamble
from cluster.raft_front_server import FrontServer

PASSWORD = "cluster-password"


def shut(server: FrontServer, admitted: list[TcpConnection]) -> None:
    for connection in admitted:
        connection.disconnect()
    server.close_waiting()
    server.unbind()


def front_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "migratory.raft"]


def test_the_front_says_a_seeds_clock_is_off_and_this_ones_went_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its clock injected: a seed 45 s ahead is admitted with a warning (at 120 s it is
    cut off), one 2 h behind is refused as stale, this clock going back an hour is said;
    GET /cluster's ``raft_front`` keeps the last skew and step (before: counts only)."""
    caplog.set_level(logging.INFO, logger="migratory.raft")
    key, address, wall = derive_key(PASSWORD), "127.0.0.1:1", [1_800_000_000.0]
    admitted: list[TcpConnection] = []
    server = FrontServer(
        createPoller("auto"), "127.0.0.1", listen_port(), admitted.append,
        gate=PreambleGate(key, address=address), send_buffer_size=2**16,
        recv_buffer_size=2**16, connection_timeout=3.0, clock=lambda: wall[0],
    )
    server.bind()

    def dial(ahead: float) -> None:
        with socket.create_connection(("127.0.0.1", server._port)) as sock:
            sock.sendall(encode_preamble(key, target=address, now=wall[0] + ahead,
                                         nonce=os.urandom(NONCE_SIZE)))
            # (read at once: this clock stands still, and the front now counts the time
            # the preamble waited in the kernel's queue)
            server._on_accept(server.fileno, 1)
            for fileno in list(server._waiting):
                server._on_preamble_bytes(fileno, 1)

    try:
        dial(45.0)
        assert len(admitted) == 1
        assert server.statistics().skew == pytest.approx(45.0, abs=0.05)
        dial(-7200.0)
        assert server.statistics().stale == 1
        assert server.statistics().skew == pytest.approx(-7200.0, abs=0.05)
        wall[0] -= 3600.0
        dial(0.0)
        assert len(admitted) == 2
        assert server.statistics().clock_stepped_back == pytest.approx(3600.0)
    finally:
        shut(server, admitted)
    assert front_lines(caplog) == [
        "Raft port: admitted a connection from 127.0.0.1: its preamble is +45.0 s off "
        "this clock: past 120 s its preambles are refused and it cannot link; check the "
        "seeds' clocks (NTP)",
        "Raft port: refused a connection from 127.0.0.1: its preamble is -7200.0 s off "
        "this clock (the limit is 120 s); check the seeds' clocks (NTP)",
        "Raft port: this seed's clock went back 3600.0 s (an NTP step, or set by hand): "
        "preambles are checked against the clock as it is now; if the seeds still "
        "disagree by more than 120 s they cannot link (check NTP)",
    ]


def test_a_seed_whose_dials_are_refused_says_so_itself(caplog: pytest.LogCaptureFixture) -> None:
    """The dialling seed's side: a seed whose front closes its connection unanswered (as
    for a clock 10 minutes off) -- before, only the refusing seed's log said anything;
    found with libfaketime, three real seeds, one 600 s ahead. One line per seed a
    minute, then a count."""
    from pysyncobj import SyncObj, SyncObjConf

    from cluster.raft_transport import SeedLinkTransport

    caplog.set_level(logging.INFO, logger="migratory.raft")
    ports = sorted((listen_port(), listen_port()), key=str)
    refusing = socket.create_server(("127.0.0.1", ports[0]))
    refusing.settimeout(0.01)
    node = SyncObj(f"127.0.0.1:{ports[1]}", [f"127.0.0.1:{ports[0]}"], conf=SyncObjConf(
        password=PASSWORD, autoTick=False, connectionRetryTime=0.05, connectionTimeout=6.0,
        raftMinTimeout=5, raftMaxTimeout=6), transportClass=SeedLinkTransport)
    refused = 0
    try:
        end = time.monotonic() + 5
        while refused < 3 and time.monotonic() < end:
            node.doTick(0.01)
            try:
                peer, _ = refusing.accept()
            except TimeoutError:
                continue
            peer.settimeout(2)
            assert len(peer.recv(64)) > 0  # its preamble (at least its first bytes)
            peer.close()  # the front's refusal: closed, nothing answered
            refused += 1
            for _ in range(20):
                node.doTick(0.01)
        cut_off = node._SyncObj__transport.refused_by()
    finally:
        node.destroy()
        refusing.close()
    lines = [r.getMessage() for r in caplog.records if "without answering" in r.getMessage()]
    assert refused == 3 and len(lines) == 1, (refused, lines)
    assert cut_off == (f"127.0.0.1:{ports[0]}",)  # the seed's readiness names it
    assert lines[0].startswith(f"Raft: seed 127.0.0.1:{ports[0]} closed this seed's Raft "
                               "connection without answering: its Raft port refused this "
                               "seed's preamble -- most likely the two clocks are more than "
                               "120 s apart (check NTP on both)")


def test_a_seed_cut_off_by_the_others_fronts_says_so_in_its_readiness() -> None:
    """/readyz and `migratory cluster status` of the seed whose dials are refused name the
    seeds and the likely cause (before: "member has not caught up with Raft yet")."""
    from collections import deque

    from cluster.raft_status import RaftStatus
    from cluster.seed_readiness import SeedReadiness

    refused = ("127.0.0.1:7001", "127.0.0.1:7011")
    reason = SeedReadiness(deque()).reason(RaftStatus(at=time.monotonic(), refused_by=refused))
    assert reason == ("member has not caught up with Raft yet: seeds 127.0.0.1:7001, "
                      "127.0.0.1:7011 close its Raft connections unanswered (most likely "
                      "their clocks and this one's are more than 120 s apart: the log)")
    assert SeedReadiness(deque()).reason(RaftStatus(at=time.monotonic())) == (
        "member has not caught up with Raft yet")


def front(clock: Callable[[], float], arrival_clock: Callable[[], float],
          admitted: list[TcpConnection]) -> tuple[FrontServer, bytes]:
    key = derive_key(PASSWORD)
    server = FrontServer(
        createPoller("auto"), "127.0.0.1", listen_port(), admitted.append,
        gate=PreambleGate(key, address="127.0.0.1:1"), send_buffer_size=2**16,
        recv_buffer_size=2**16, connection_timeout=3.0, clock=clock,
        arrival_clock=arrival_clock,
    )
    server.bind()
    return server, key


def read_after(server: FrontServer, preamble: bytes, wait: float,
               stopped: Callable[[], None] = lambda: None) -> None:
    """A peer sends ``preamble``; the front reads it ``wait`` s later, after ``stopped``
    (what a stop of this seed did to the clocks meanwhile)."""
    with socket.create_connection(("127.0.0.1", server._port)) as sock:
        sock.sendall(preamble)
        time.sleep(wait)
        stopped()
        server._on_accept(server.fileno, 1)
        for fileno in list(server._waiting):
            server._on_preamble_bytes(fileno, 1)


def test_a_preamble_that_waited_while_this_seed_was_stopped_is_not_a_clock_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A seed SIGSTOPped 13 s reads, once continued, the preambles its peers sent during
    the stop. Before, it warned "its preamble is -13.0 s off this clock" (and at 120 s
    refused it as a clock off, "check the seeds' clocks"): the clocks agreed, the bytes
    had waited in the kernel's queue. The skew is now measured against the time the
    preamble reached this host (the kernel's timestamp); the stop is emulated by moving
    both clocks on while the preamble waits."""
    caplog.set_level(logging.INFO, logger="migratory.raft")
    wall, stop = [1_800_000_000.0], [0.0]
    admitted: list[TcpConnection] = []
    server, key = front(lambda: wall[0], lambda: time.time() + stop[0], admitted)

    def stopped_for(seconds: float) -> Callable[[], None]:
        def stopped() -> None:  # (the kernel's stamps are real: only this read is late)
            wall[0] += seconds
            stop[0] = seconds
        return stopped

    def preamble(ahead: float = 0.0) -> bytes:
        return encode_preamble(key, target="127.0.0.1:1", now=wall[0] + ahead,
                               nonce=os.urandom(NONCE_SIZE))

    try:
        read_after(server, preamble(), 0.0, stopped_for(13.0))
        assert len(admitted) == 1
        assert abs(server.statistics().skew) < 1.0  # before: -13.0
        read_after(server, preamble(45.0), 0.0, stopped_for(13.0))  # a clock off, too
        assert len(admitted) == 2 and server.statistics().skew == pytest.approx(45.0, abs=1)
        read_after(server, preamble(), 0.0, stopped_for(150.0))
        assert server.statistics().stale == 1 and abs(server.statistics().skew) < 1.0
    finally:
        shut(server, admitted)
    assert front_lines(caplog) == [
        "Raft port: admitted a connection from 127.0.0.1: its preamble is +45.0 s off "
        "this clock when it arrived (read 13.0 s later): past 120 s its preambles are "
        "refused and it cannot link; check the seeds' clocks (NTP)",
        "Raft port: refused a connection from 127.0.0.1: its preamble waited 150.0 s in "
        "this seed's queue before it was read (this seed stopped or starved meanwhile): "
        "past the 120 s limit by then; it dials again",
    ]


def test_the_skew_is_measured_from_when_the_kernel_took_the_preamble() -> None:
    """The real clocks: a preamble read 0.5 s after it came measures no skew (before:
    -0.5 s). Needs Linux's SO_TIMESTAMP on the accepted socket."""
    admitted: list[TcpConnection] = []
    server, key = front(time.time, time.time, admitted)
    try:
        read_after(server, encode_preamble(key, target="127.0.0.1:1", now=time.time(),
                                           nonce=os.urandom(NONCE_SIZE)), 0.5)
        assert len(admitted) == 1
        assert abs(server.statistics().skew) < 0.1, server.statistics().skew
    finally:
        shut(server, admitted)
