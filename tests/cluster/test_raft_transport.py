"""A seed's name moves to a new address while a dial to the old one gets no answer.

The StatefulSet case (cluster/raft_transport.py): a seed pod is recreated under the
same name with a new IP, and the seed dialling it has a dial to the old IP pending that
nobody answers. Here on loopback: the "old pod" is a listener whose accept queue is
full (Linux then drops the SYN without answering, as for a vanished pod's IP), the
"new pod" a real pysyncobj node on another loopback address, and the name resolves to
one, then the other. pysyncobj is ticked by the test (``autoTick=False``), no threads;
each node binds its own loopback address (pysyncobj binds 0.0.0.0 otherwise).

These pin pysyncobj 0.3.17's unlimited wait (so a version that changes it shows up
here) and show that :class:`cluster.raft_transport.SeedLinkTransport` links up.
"""

from __future__ import annotations

import logging
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from listen_ports import listen_port
from pysyncobj import SyncObj, SyncObjConf, dns_resolver
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from no_descriptors import no_descriptor_left

from cluster.raft_transport import SeedLinkTransport

OLD_IP, NEW_IP, DIALLER_IP = "127.0.0.3", "127.0.0.4", "127.0.0.2"
SEED_A, SEED_B = "seed-a.test", "seed-b.test"  # B > A: B dials A (pysyncobj's rule)
CONNECTION_TIMEOUT = 1.0


class Names:
    """The names the test's "cluster DNS" resolves, changed as a pod is recreated."""

    def __init__(self) -> None:
        self.records = {SEED_A: OLD_IP, SEED_B: DIALLER_IP}


@pytest.fixture
def names(monkeypatch: pytest.MonkeyPatch) -> Names:
    names = Names()
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):  # type: ignore[no-untyped-def]
        return real(names.records.get(host, host), port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(dns_resolver, "_g_resolver", None)  # nothing cached by another test
    return names


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port on OLD_IP that never answers a SYN: its accept queue is full."""
    with socket.socket() as listener:
        listener.bind((OLD_IP, 0))
        listener.listen(0)
        port = int(listener.getsockname()[1])
        with socket.create_connection((OLD_IP, port)):  # fills the queue
            yield port


def conf(**extra: object) -> SyncObjConf:
    return SyncObjConf(
        password="x", autoTick=False, raftMinTimeout=0.15, raftMaxTimeout=0.3,
        appendEntriesPeriod=0.04, connectionTimeout=CONNECTION_TIMEOUT,
        connectionRetryTime=0.3, dnsCacheTime=1.0, dnsFailCacheTime=1.0,
        maxBindRetries=3, bindRetryTime=0.1, **extra,  # a taken port fails, never spins
    )


def link_to_recreated_seed(port: int, names: Names, transport: type, wait: float
                           ) -> tuple[float | None, int]:
    """Seed B dials seed A at its old address; A is recreated at a new one. Returns the
    seconds until B has a link to A (``None`` if not within ``wait``) and the state of
    B's connection to A then."""
    dialler = SyncObj(f"{SEED_B}:{port}", [f"{SEED_A}:{port}"],
                      conf=conf(bindAddress=f"{DIALLER_IP}:{port}"), transportClass=transport)
    seed_a = None
    try:
        began = time.monotonic()
        while time.monotonic() < began + 0.5:  # B dials A at the old IP
            dialler.doTick(0.01)
        node = next(iter(dialler.otherNodes))
        connection = dialler._SyncObj__transport._connections[node]
        assert connection.state == CONNECTION_STATE.CONNECTING
        names.records[SEED_A] = NEW_IP  # the pod is recreated, at a new IP
        seed_a = SyncObj(f"{SEED_A}:{port}", [f"{SEED_B}:{port}"],  # both sides the same code
                         conf=conf(bindAddress=f"{NEW_IP}:{port}"), transportClass=transport)
        recreated = time.monotonic()
        while time.monotonic() < recreated + wait:
            dialler.doTick(0.005)
            seed_a.doTick(0.005)
            if dialler.isNodeConnected(node):
                return time.monotonic() - recreated, connection.state
        return None, dialler._SyncObj__transport._connections[node].state
    finally:
        for syncobj in (dialler, seed_a):
            if syncobj is not None:
                syncobj.destroy()


def test_pysyncobj_waits_on_an_unanswered_dial_without_limit(
    names: Names, silent_port: int
) -> None:
    linked, state = link_to_recreated_seed(silent_port, names, TCPTransport,
                                           wait=4 * CONNECTION_TIMEOUT)
    assert linked is None and state == CONNECTION_STATE.CONNECTING, (
        "pysyncobj changed: it now ends a dial nobody answers; revisit "
        "cluster/raft_transport.py"
    )


def test_seed_link_transport_dials_the_new_address_in_seconds(
    names: Names, silent_port: int
) -> None:
    linked, _ = link_to_recreated_seed(silent_port, names, SeedLinkTransport,
                                       wait=4 * CONNECTION_TIMEOUT)
    assert linked is not None and linked < 3 * CONNECTION_TIMEOUT


def test_a_dial_the_kernel_completed_is_left_to_pysyncobj(names: Names) -> None:
    """A Raft thread kept off the CPU longer than the limit: the dial has been answered
    but pysyncobj's poller has not seen it yet. That dial is not abandoned."""
    with socket.socket() as listener:
        listener.bind((NEW_IP, 0))
        listener.listen(5)
        port = int(listener.getsockname()[1])
        names.records[SEED_A] = NEW_IP
        dialler = SyncObj(f"{SEED_B}:{port}", [f"{SEED_A}:{port}"],
                          conf=conf(bindAddress=f"{DIALLER_IP}:{port}"),
                          transportClass=SeedLinkTransport)
        try:
            transport = dialler._SyncObj__transport
            node = next(iter(dialler.otherNodes))
            transport._connectIfNecessary()  # dials, as a tick does before it polls
            connection = transport._connections[node]
            dialled = transport._lastConnectAttempt[node]
            assert connection.state == CONNECTION_STATE.CONNECTING
            time.sleep(CONNECTION_TIMEOUT + 0.2)  # no tick: the poller never ran
            transport.abandon_stalled_dials(time.monotonic())
            assert transport._lastConnectAttempt[node] == dialled  # not dialled again
            assert connection.state == CONNECTION_STATE.CONNECTING
            dialler.doTick(0.1)
            assert connection.state == CONNECTION_STATE.CONNECTED
        finally:
            dialler.destroy()


def test_a_dial_with_no_descriptor_left_is_put_off_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A seed out of descriptors dials a seed: pysyncobj's ``socket()`` raised EMFILE out
    of the tick (its auto-tick thread logged "failed _onTick in _autoTickThread" with a
    traceback at each dial, every connectionRetryTime, the rest of the tick skipped).
    Now the dial is put off to the next connectionRetryTime, said once, counted."""
    caplog.set_level(logging.INFO, logger="migratory.raft")
    port = listen_port(span=2)
    # me > other: this seed dials (pysyncobj's rule); nobody listens there
    other, me = sorted(f"127.0.0.1:{p}" for p in (port, port + 1))
    node = SyncObj(me, [other], conf=conf(), transportClass=SeedLinkTransport)
    transport = node._SyncObj__transport
    dials: set[float] = set()  # when each dial began (pysyncobj's _lastConnectAttempt)

    def dialled() -> int:
        """Dials begun since the seed started listening."""
        dials.update(transport._lastConnectAttempt.values())
        return len(dials - before)

    try:
        node.doTick(0.01)  # listening (and maybe a first dial, refused)
        before = set(transport._lastConnectAttempt.values())
        with no_descriptor_left():
            for _ in range(500):  # ~0.3 s apart: 3 dials within ~1 s
                node.doTick(0.01)
                if dialled() == 3:
                    break
        assert dialled() == 3
        for _ in range(100):
            node.doTick(0.01)
            if dialled() == 4:
                break  # a dial made a socket again (refused: nobody listens)
    finally:
        node.destroy()
    lines = [r.getMessage() for r in caplog.records if r.name == "migratory.raft"]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"Raft: cannot dial seed {other}: EMFILE (Too many open files)")
    assert "working again after 3 failures" in lines[1]
    assert not any(r.exc_info for r in caplog.records)
