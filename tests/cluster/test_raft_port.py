"""The Raft port trusts no unauthenticated byte, and unpickles only our types even from
a peer with the password (cluster/raft_transport.py, cluster/raft_unpickler.py).

Real pysyncobj nodes on loopback, ticked by the test (``autoTick=False``) unless said
otherwise. The cases that pin pysyncobj's own behaviour show the tests can fail.
"""

from __future__ import annotations

import io
import os
import pickle
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from listen_ports import listen_port
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.tcp_connection import TcpConnection
from pysyncobj.transport import TCPTransport
from raft_port_probe import count_incoming

from cluster import raft_unpickler
from cluster.coordination import Coordinator, PublishRequest
from cluster.raft import to_wire
from cluster.raft_front import NONCE_SIZE, derive_key, encode_preamble
from cluster.raft_transport import (
    MAX_UNAUTHENTICATED_BYTES,
    UNAUTHENTICATED_SECONDS,
    SeedLinkTransport,
)
from cluster.replicated_cache import ReplicatedCache
from migratory.model.message import Message, Qos

raft_unpickler.install()


class Payload:
    """Unpickling this runs ``touch <marker>``: what an attacker would send."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def test_the_restricted_unpickler_refuses_code_and_takes_our_types(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    data = pickle.dumps(Payload(marker), 2)
    pickle.loads(data)  # the planted check: plain pickle runs it
    assert marker.exists()
    marker.unlink()
    with pytest.raises(pickle.UnpicklingError, match=r"(posix|os)\.system"):
        raft_unpickler.loads(data)
    assert not marker.exists()
    for evil in (
        pickle.dumps(eval, 2),
        pickle.dumps(getattr, 2),
        pickle.dumps(Coordinator.to_state, 4),  # a dotted name: reaches through a class
    ):
        with pytest.raises(pickle.UnpicklingError):
            raft_unpickler.loads(evil)
    cache = ReplicatedCache(10)
    message = Message("/a/b", b"\x00\xff", {"k": "v"}, True, Qos.GUARANTEED)
    ours = [
        ("origin", 1, "/a/b", b"\x80bytes", {"f": "v"}, True, False),
        message,
        Qos.GUARANTEED,
        PublishRequest("m1", 3, message),
        Coordinator(),
        cache,
        {"type": "append_entries", "entries": [(b"cmd", 1, 2)], "term": 3},
        {1, 2},
        frozenset({3}),
        bytearray(b"x"),
        b"",  # protocol 2: bytes() (was refused: test_cluster_empty_payload.py)
        Message("/a/b", b""),
    ]
    for value in ours:
        for protocol in (2, pickle.HIGHEST_PROTOCOL):
            restored = raft_unpickler.loads(pickle.dumps(value, protocol))
            assert type(restored) is type(value)


def conf(**extra: object) -> SyncObjConf:
    return SyncObjConf(
        password="cluster-password", autoTick=False, raftMinTimeout=0.15,
        raftMaxTimeout=0.3, appendEntriesPeriod=0.04, connectionTimeout=1.0,
        connectionRetryTime=0.3, maxBindRetries=3, bindRetryTime=0.1, **extra,
    )


def free_port() -> int:
    return listen_port()  # below the ephemeral range: see listen_ports.py


@pytest.fixture(params=[SeedLinkTransport, TCPTransport], ids=["ours", "pysyncobj"])
def lone_seed(request: pytest.FixtureRequest) -> Iterator[tuple[SyncObj, int, type]]:
    port = free_port()
    node = SyncObj(f"127.0.0.1:{port}", [], conf=conf(), transportClass=request.param)
    try:
        for _ in range(20):
            node.doTick(0.01)
        yield node, port, request.param
    finally:
        node.destroy()


def tick_until(node: SyncObj, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        node.doTick(0.01)


def closed(sock: socket.socket) -> bool:
    sock.settimeout(0)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def test_idle_unauthenticated_connections_are_closed(
    lone_seed: tuple[SyncObj, int, type],
) -> None:
    node, port, transport = lone_seed
    idle = []
    for _ in range(30):  # pysyncobj accepts only while ticked (and its backlog is 5)
        idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        node.doTick(0.01)
    tick_until(node, UNAUTHENTICATED_SECONDS + 1.0)
    open_count = sum(not closed(sock) for sock in idle)
    for sock in idle:
        sock.close()
    if transport is TCPTransport:
        assert open_count == 30, "pysyncobj changed: it closes idle connections itself"
    else:
        assert open_count == 0


def test_garbage_from_an_unauthenticated_peer_is_not_buffered(
    lone_seed: tuple[SyncObj, int, type],
) -> None:
    node, port, transport = lone_seed
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(0)
    sent = 0
    chunk = struct.pack("i", 1 << 30) + os.urandom(65536)  # announces a 1 GiB message
    end = time.monotonic() + 2.0
    while time.monotonic() < end and sent < 4 * MAX_UNAUTHENTICATED_BYTES:
        try:
            sent += sock.send(chunk)
        except BlockingIOError:
            pass
        except OSError:
            break
        node.doTick(0.005)
    tick_until(node, 0.3)
    was_closed = closed(sock)
    sock.close()
    if transport is TCPTransport:
        assert not was_closed and sent >= 4 * MAX_UNAUTHENTICATED_BYTES
    else:
        assert was_closed


def test_a_sealed_os_system_payload_is_refused(
    lone_seed: tuple[SyncObj, int, type], tmp_path: Path
) -> None:
    node, port, transport = lone_seed
    marker = tmp_path / "pwned"
    plain = zlib.compress(pickle.dumps(Payload(marker), 2), 3)
    sealed = node.encryptor.encrypt_at_time(plain, int(time.time()))  # the right password
    # past the front too (it has the password): the payload reaches pysyncobj
    preamble = b"" if transport is TCPTransport else encode_preamble(
        derive_key("cluster-password"), target=f"127.0.0.1:{port}", now=time.time(),
        nonce=os.urandom(NONCE_SIZE))
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(preamble + struct.pack("i", len(sealed)) + sealed)
    tick_until(node, 0.5)
    assert not marker.exists()
    assert closed(sock)  # pysyncobj drops a connection whose message does not load
    sock.close()


def test_a_lost_listener_listens_again() -> None:
    port = free_port()
    node = SyncObj(f"127.0.0.1:{port}", [], conf=conf(), transportClass=SeedLinkTransport)
    try:
        tick_until(node, 0.2)
        transport = node._SyncObj__transport
        transport._server.unbind()  # what pysyncobj does when accept fails (EMFILE)
        tick_until(node, 0.5)
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
    finally:
        node.destroy()


@pytest.mark.slow
def test_leadership_does_not_change_under_unauthenticated_garbage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ports = [free_port() for _ in range(3)]
    addresses = [f"127.0.0.1:{p}" for p in ports]
    nodes = [
        SyncObj(a, [b for b in addresses if b != a],
                conf=SyncObjConf(password="cluster-password", raftMinTimeout=0.3,
                                 raftMaxTimeout=0.6, appendEntriesPeriod=0.05,
                                 connectionTimeout=1.0),
                transportClass=SeedLinkTransport)
        for a in addresses
    ]
    try:
        deadline = time.monotonic() + 30
        while not all(n.getStatus()["leader"] is not None for n in nodes):
            assert time.monotonic() < deadline, "no leader"
            time.sleep(0.05)
        time.sleep(0.5)  # every node has heard of the leader
        leader = nodes[0].getStatus()["leader"]
        term = nodes[0].getStatus()["raft_term"]
        target = ports[addresses.index(leader.address)]
        incoming: list[TcpConnection] = count_incoming(monkeypatch)  # from now on
        stop = threading.Event()
        pushed = [0]

        def push_garbage() -> None:
            while not stop.is_set():
                try:
                    with socket.create_connection(("127.0.0.1", target), timeout=1) as sock:
                        while not stop.is_set():
                            pushed[0] += sock.send(os.urandom(1 << 16))
                except OSError:
                    continue

        pushers = [threading.Thread(target=push_garbage) for _ in range(4)]
        for thread in pushers:
            thread.start()
        time.sleep(5)
        stop.set()
        for thread in pushers:
            thread.join(5)
        assert pushed[0] > 20_000_000, pushed  # the issue's 20 MB, and more
        # none of it reached pysyncobj (pysyncobj alone: one TcpConnection per garbage
        # connection, hundreds); a seed's link, had one dropped and been redialled, would
        assert len(incoming) <= 2, len(incoming)
        terms = [n.getStatus()["raft_term"] for n in nodes]
        assert terms == [term] * 3, terms
        assert all(n.getStatus()["leader"] == leader for n in nodes)
    finally:
        for node in nodes:
            node.destroy()


class Unpickler524f73f(raft_unpickler.RaftUnpickler):
    """The Raft unpickler of 524f73f, the previous version: all of today's but
    ``builtins.bytes`` (added by 87c2a4e)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in (("builtins", "bytes"), ("__builtin__", "bytes")):
            raise pickle.UnpicklingError(f"Raft: refusing to unpickle {module}.{name}")
        return super().find_class(module, name)


def test_a_command_with_an_empty_content_is_one_a_seed_of_524f73f_unpickles() -> None:
    """An empty content (MQTT's empty payload), pickled by pysyncobj with protocol 2,
    was ``bytes()``, which a 524f73f seed refuses: during a rolling upgrade, one taken
    by an upgraded seed stopped every old seed's Raft (two old seeds of three: nothing
    committed after it). Now the command carries it as protocol 2 writes any other
    ``bytes``, which both take, and it is a plain empty ``bytes`` once unpickled."""
    import pysyncobj.pickle as pysyncobj_pickle

    requests = [PublishRequest("origin#1", 7, Message("/a/b", b"")),
                PublishRequest("origin#1", 8, Message("/a/b", b"after", {"f": ""}, True))]
    command = (3, (11, to_wire(requests)))  # as pysyncobj's @replicated pickles it
    data = pysyncobj_pickle.dumps(command)
    for unpickler in (Unpickler524f73f, raft_unpickler.RaftUnpickler):
        funcid, (epoch, wire) = unpickler(io.BytesIO(data)).load()
        assert (funcid, epoch, wire) == (3, 11, to_wire(requests))
        assert type(wire[0][3]) is bytes and wire[0][3] == b""
    # a command without one is pickled as before, byte for byte
    plain = (3, (11, to_wire(requests[1:])))
    assert pysyncobj_pickle.dumps(plain) == pickle.dumps(
        (3, (11, [("origin#1", 8, "/a/b", b"after", {"f": ""}, True, False)])), 2)
