"""Token entitlement and clocks (migratory/entitlement_token.py, its clock injected): the
server's clock stepping, and an issuer whose clock is not the server's. ``exp`` is checked
without leeway, ``nbf`` with NOT_BEFORE_LEEWAY (30 s), ``iat`` decides nothing but says
when the clocks disagree."""

from __future__ import annotations

import logging
import time
from typing import Any

import jwt
import pytest

from migratory import client_lines
from migratory.client_lines import ClientLines
from migratory.entitlement import ClientIdentity
from migratory.entitlement_decisions import connect_refusal
from migratory.entitlement_token import NOT_BEFORE_LEEWAY, TokenEntitlement
from migratory.protocol import close_codes

SECRET = "s" * 40
T0 = 1_800_000_000
HOUR, DAY = 3600, 86400


@pytest.fixture(autouse=True)
def fresh_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_lines, "lines", ClientLines())  # no line held from another


def who(**claims: Any) -> ClientIdentity:
    token = jwt.encode({"sub": "alice", "subscribe": ["/a/**"], **claims}, SECRET,
                       algorithm="HS256")
    return ClientIdentity("alice", token, "127.0.0.1:1")


def entitlement(now: list[float]) -> TokenEntitlement:
    return TokenEntitlement(algorithm="HS256", keys=SECRET.encode(), clock=lambda: now[0])


@pytest.mark.parametrize("step", [HOUR, DAY])
def test_the_servers_clock_stepping_forward_ends_tokens_early(step: int) -> None:
    """A token with 10 minutes left is expired once the clock jumps: refused, and the
    session's expiry (what app.py closes 4503 TOKEN_EXPIRED by) has passed."""
    now = [float(T0)]
    checks = entitlement(now)
    client = who(iat=T0, exp=T0 + 600)
    assert checks.allow_connect(client)
    now[0] += step
    assert not checks.allow_connect(client)
    assert not checks.allow_subscribe(client, "/a/b")
    expiry = checks.expiry(client)
    assert expiry is not None and expiry <= now[0]


def test_the_servers_clock_stepping_back_accepts_an_expired_token_again() -> None:
    """A limit, pinned: only this server's clock judges ``exp``; set back an hour, a token
    that expired half an hour ago is accepted again until the clock passes its exp once
    more. The step is said by the server's wall-clock watch (docs/security.md)."""
    now = [float(T0)]
    checks = entitlement(now)
    client = who(iat=T0 - HOUR, exp=T0 - HOUR // 2)
    assert not checks.allow_connect(client)
    now[0] -= HOUR
    assert checks.allow_connect(client)
    now[0] += HOUR // 2
    assert not checks.allow_connect(client)


@pytest.mark.parametrize(
    ("ahead", "connects"),
    [(2, True), (-2, True), (120, False), (-120, True), (2 * HOUR, False), (-2 * HOUR, False)],
)
def test_an_issuer_whose_clock_is_not_the_servers(
    ahead: int, connects: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A token just issued (iat = nbf, exp 10 minutes on) by an issuer ``ahead`` seconds
    ahead of the server. Within the leeway: accepted. 2 min ahead: refused until its nbf
    is within 30 s, and said; 2 h behind: refused as expired (10 minutes of life), which
    no claim tells from an old token."""
    caplog.set_level(logging.DEBUG, logger="migratory.entitlement")
    now = [float(T0)]
    issued = T0 + ahead
    client = who(iat=issued, nbf=issued, exp=issued + 600)
    assert entitlement(now).allow_connect(client) is connects
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if ahead > NOT_BEFORE_LEEWAY:
        assert len(warnings) == 2, warnings
        assert warnings[0].startswith(f"token issued (iat) {ahead} s ahead of this server's "
                                      "clock: this server's clock is behind the issuer's")
        assert warnings[1].startswith(f"token refused: not valid before (nbf) {ahead} s "
                                      "from now by this server's clock, past the 30 s leeway")
    else:
        assert warnings == []


def test_a_server_behind_the_issuer_says_so_and_accepts_past_exp(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No nbf, the server 2 h behind: the token is accepted for 2 h past its real exp (a
    limit: only this clock judges), and its iat, 2 h ahead, is said at WARNING."""
    now = [float(T0 - 2 * HOUR)]
    client = who(iat=T0, exp=T0 + 600)
    checks = entitlement(now)
    assert checks.allow_connect(client)
    now[0] = T0 + 600 - 1
    assert checks.allow_connect(client)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [w[:40] for w in warnings] == ["token issued (iat) 7200 s ahead of this "]


def test_a_token_refused_for_being_early_asks_for_a_reconnect_not_an_end() -> None:
    """The issuer's clock 2 min ahead: its token is refused now and accepted once its
    time comes, so the refusal is 4504 TOKEN_NOT_YET_VALID (reconnect), its reason naming
    nbf and the clocks -- it was 4003 CONNECT_DENIED, which ends every SDK client for
    good. Garbage stays 4003, an expired token 4503."""
    now = [float(int(time.time()))]
    checks = entitlement(now)
    early = who(iat=int(now[0]) + 120, nbf=int(now[0]) + 120, exp=int(now[0]) + 720)
    assert not checks.allow_connect(early)
    code, why = connect_refusal(checks, early)
    assert code is close_codes.TOKEN_NOT_YET_VALID and code.reconnect
    assert "(nbf) 120 s from now by this server's clock" in why and "issuer's clock" in why
    expired = who(exp=int(now[0]) - 5)
    assert connect_refusal(checks, expired)[0] is close_codes.TOKEN_EXPIRED
    garbage = ClientIdentity("alice", "not.a.jwt", "127.0.0.1:1")
    assert connect_refusal(checks, garbage)[0] is close_codes.CONNECT_DENIED
    now[0] += 120 - NOT_BEFORE_LEEWAY  # its time comes
    assert checks.allow_connect(early) and checks.not_yet_valid(early) is None
