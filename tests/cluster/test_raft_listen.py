"""A seed whose Raft port is taken says so, and joins as soon as the port is free.

pysyncobj retries a failed bind every ``bindRetryTime`` without a word and holds no
election meanwhile: a seed whose Raft port (its cluster port + 1) another process holds
sat out of its cluster with nothing in its log and "has not caught up with Raft yet" as
its readiness reason (a CI run's single-node submit waited for ever on exactly that).
Real pysyncobj, real sockets on loopback.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

import pytest
from listen_ports import seed_port

from cluster.raft import RaftCoordination


def wait_for(predicate: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_seed_whose_raft_port_is_taken_says_so_then_joins_once_it_is_free(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = seed_port()
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", port + 1))
    squatter.listen()
    caplog.set_level(logging.INFO, logger="migratory.raft")
    committed: list[object] = []
    raft = RaftCoordination(
        self_address=("127.0.0.1", port), seed_addresses=[("127.0.0.1", port)],
        password="x", on_commit=committed.append,
    )
    try:
        done = threading.Event()
        raft.submit(2, [], lambda clsn, error, unknown: done.set())
        assert wait_for(lambda: raft.snapshot.listen_error is not None, 5)
        error = raft.snapshot.listen_error
        assert error is not None
        # no bind address given: the Raft port listens on the seed's own host
        assert f"cannot listen on 127.0.0.1:{port + 1}: " in error and "in use" in error
        assert raft.status()["raft_listen_error"] == error
        logged = [r for r in caplog.records if r.levelno == logging.ERROR
                  and f"127.0.0.1:{port + 1}" in r.getMessage()]
        assert logged, "the failed bind was not logged"
        assert "cluster port + 1" in logged[0].getMessage()
        time.sleep(1.2)  # a retry or more: logged once, not once per attempt
        assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1
        assert not done.is_set() and raft.snapshot.state != "leader"

        squatter.close()
        assert done.wait(10), "the seed did not join once its port was free"
        assert wait_for(lambda: raft.snapshot.listen_error is None, 2)
        assert any("at last" in r.getMessage() for r in caplog.records)
    finally:
        squatter.close()
        raft.close()


def test_a_seed_given_no_bind_address_listens_on_its_own_host_only() -> None:
    """Without ``bind_address`` the Raft port listened on 0.0.0.0 (pysyncobj's rule for a
    node without ``bindAddress``): every test that built a seed so, and any caller that
    forgot the bind, had its pickle port on every interface. 127.0.0.2 is loopback too,
    so a socket on every interface answers there; one on 127.0.0.1 does not."""
    port = seed_port()
    raft = RaftCoordination(
        self_address=("127.0.0.1", port), seed_addresses=[("127.0.0.1", port)],
        password="x", on_commit=lambda _batch: None,
    )
    try:
        assert wait_for(lambda: raft.snapshot.state == "leader", 10)
        with socket.create_connection(("127.0.0.1", port + 1), timeout=2):
            pass
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.2", port + 1), timeout=2).close()
    finally:
        raft.close()
