"""Per-client log lines on the paths a storm walks (migratory/client_lines.py): one line
per kind every LINE_EVERY seconds at its level, the rest at DEBUG, the totals in the
server's counters. Lines are counted; the clock is the test's (it never moves unless the
test moves it)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

from migratory import client_lines
from migratory.client_lines import ClientLines
from migratory.config import Config
from migratory.entitlement import entitlement_from_config
from migratory.protocol import close_codes, ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import handshake_request, new_websocket_key
from migratory.server.app import build_hub
from migratory.server.context import ServerContext, ServerStatistics
from migratory.server.metric_figures import PublishTimings

if TYPE_CHECKING:
    from migratory.server.session import Session

CLIENTS = 1_000


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(client_lines, "lines", ClientLines(clock=clock))
    return clock


def said(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


def test_one_line_per_kind_per_interval_and_the_next_counts_the_rest(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    log = logging.getLogger("migratory.test")
    caplog.set_level(logging.DEBUG, "migratory.test")
    lines = client_lines.lines
    for n in range(10_000):
        lines.log(log, logging.WARNING, "slow consumer", "client %d: slow", n)
    lines.log(log, logging.INFO, "other kind", "another kind has its own line")
    assert said(caplog) == ["client 0: slow", "another kind has its own line"]
    assert len(caplog.records) == 10_001  # each at DEBUG all the same
    assert lines.held == 9_999
    clock.now = client_lines.LINE_EVERY
    lines.log(log, logging.WARNING, "slow consumer", "client %d: slow", 10_000)
    assert said(caplog)[-1] == ("client 10000: slow (9999 more like it since the last such "
                                "line: at DEBUG)")


class Wire:
    writing = False

    def mark_dirty(self) -> None:
        pass

    def flush_now(self) -> None:
        pass


class Publishing:
    def __init__(self) -> None:
        self.timings = PublishTimings()

    def submit(self, message: object, reply: object, now: float) -> None:
        pass

    def statistics(self) -> dict[str, object]:
        return {}


def sessions(ctx: ServerContext, count: int) -> list[Session]:
    from migratory.server.session import Session

    out = []
    for n in range(count):
        session = Session(ctx, Wire(), f"127.0.0.1:{n + 1}")
        connect = ws.encode_masked_binary(ops.encode_client_op(ops.Connect(f"c{n}")), b"mask")
        session.receive_data(handshake_request("127.0.0.1", "/", new_websocket_key())
                             + connect, 0.0)
        out.append(session)
    return out


def test_a_wave_of_clients_makes_a_line_per_kind_and_counts_each(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """1,000 clients refused by a member not ready (1013), then 1,000 cut off as slow
    consumers: before, 2,000 lines (one per client); now one of each kind, and every
    client counted (migratory_connections_closed_total, migratory_slow_consumers_total)."""
    caplog.set_level(logging.INFO, "migratory")
    config = Config.defaults()
    not_ready = ["member is syncing its cache"]
    ctx = ServerContext(config, build_hub(config), entitlement_from_config(config),
                        ServerStatistics(), Publishing(),
                        readiness=lambda: not_ready[0] if not_ready else None)
    refused = sessions(ctx, CLIENTS)
    assert {s.close_code for s in refused} == {close_codes.TRY_AGAIN_LATER.code}
    not_ready.clear()
    for session in sessions(ctx, CLIENTS):
        session.cut_off("does not read")
    lines = said(caplog)
    assert len(lines) == 2, lines[:5]
    assert "closing with 1013" in lines[0] and "slow consumer cut off" in lines[1]
    assert ctx.stats.closes == {"TRY_AGAIN_LATER": CLIENTS}
    assert ctx.stats.slow_consumers == CLIENTS
