"""pysyncobj's lines about a seed's name that does not resolve (cluster/raft_name_lookups.py):
counted, with lookups that fail at once (getaddrinfo replaced) and a clock the test moves."""

from __future__ import annotations

import logging
import socket
from typing import Any

import pytest
from listen_ports import listen_port
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.dns_resolver import DnsCachingResolver

from cluster.raft_name_lookups import LOGGER, NameLookupFailures
from cluster.raft_transport import SeedLinkTransport

NAME = "migratory-2.migratory-members"


def no_such_name(*args: Any, **kwargs: Any) -> Any:
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def lookups(count: int) -> None:
    resolver = DnsCachingResolver(-1, -1)  # a lookup at each call (failures cached for 1 s
    # in a seed: one a second while a dial comes every 0.3 s)
    for _ in range(count):
        assert resolver.resolve(NAME) is None


def test_a_seed_says_once_that_a_name_does_not_resolve(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """pysyncobj logs each failed lookup twice: 200 lines for 100 lookups (a seed away,
    dialled every 0.3 s, its name looked up again after 1 s: 2 lines a second)."""
    node = SyncObj(f"127.0.0.1:{listen_port()}", [], transportClass=SeedLinkTransport,
                   conf=SyncObjConf(password="x", autoTick=False))
    node.destroy()  # a seed of this process: its transport put the filter on
    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    caplog.set_level(logging.INFO, logger=LOGGER)
    lookups(100)
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert lines == [f"Raft: failed to resolve host {NAME}: the seed is not up yet, or DNS "
                     "fails (said again at most every 60 s)"]


def test_a_name_that_still_does_not_resolve_is_said_again_with_a_count(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    logger = logging.getLogger(LOGGER)
    counted = NameLookupFailures(clock=lambda: now[0])
    monkeypatch.setattr(logger, "filters", [counted])  # this one alone
    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    caplog.set_level(logging.INFO, logger=LOGGER)
    for _ in range(150):  # a lookup a second for 150 s
        lookups(1)
        now[0] += 1.0
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 3, lines  # at 0, 60 and 120 s
    assert lines[1].endswith("(59 more failed lookups since the last such line)")
    logger.info("another line of pysyncobj's resolver")  # passes untouched
    assert caplog.records[-1].getMessage() == "another line of pysyncobj's resolver"
