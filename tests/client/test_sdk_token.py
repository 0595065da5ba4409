"""Entitlement = Token on a live server: an expired token ends the session with 4503,
and the SDK's token provider gives the next session a fresh token; the subscription
resumes with no gap."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jwt
import trio
from sdk_fake_server import FAST

from migratory.protocol import close_codes, ops

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
from rawclient import RawClient

from migratory_client import NotificationStatus, connect

SECRET = "k" * 48
def token(seconds: float, **grant: list[str]) -> str:
    claims = {"sub": "t", "exp": int(time.time() + seconds), **grant}
    return jwt.encode(claims, SECRET, algorithm="HS256")


def token_server(start_server: Callable[..., Any], tmp_path: Path) -> Any:
    key_file = tmp_path / "jwt.secret"
    key_file.write_text(SECRET)
    key_file.chmod(0o600)
    return start_server(
        Entitlement="Token", EntitlementTokenKeyFile=str(key_file), BatchTime="0"
    )


def test_an_expiring_token_ends_the_session_with_4503(
    start_server: Callable[..., Any], tmp_path: Path
) -> None:
    server = token_server(start_server, tmp_path)
    refused = RawClient(server.port)
    refused.send_op(ops.Connect(client="x", token=token(-10, subscribe=["/a/**"])))
    assert refused.recv_close().code == close_codes.TOKEN_EXPIRED.code
    forged = RawClient(server.port)
    stranger = jwt.encode({"exp": time.time() + 60}, "x" * 48, algorithm="HS256")
    forged.send_op(ops.Connect(client="x", token=stranger))
    assert forged.recv_close().code == close_codes.CONNECT_DENIED.code
    client = RawClient(server.port)
    expiring = token(4, subscribe=["/a/**"])  # 3-4 s: connected well before it expires
    expires_at = jwt.decode(expiring, SECRET, algorithms=["HS256"])["exp"]
    client.connect("t", token=expiring)
    close = client.recv_close(timeout=30)  # a hang guard, not the claim
    assert close.code == close_codes.TOKEN_EXPIRED.code == 4503
    assert time.time() >= expires_at  # not before the token's exp (a busy box: later)
    assert close_codes.TOKEN_EXPIRED.reconnect


def test_the_token_provider_gives_each_session_a_fresh_token(
    start_server: Callable[..., Any], tmp_path: Path
) -> None:
    async def bounded() -> None:
        with trio.fail_after(30):
            await provider_gives_fresh_tokens(start_server, tmp_path)

    trio.run(bounded)


async def provider_gives_fresh_tokens(start_server: Callable[..., Any], tmp_path: Path) -> None:
    server = await trio.to_thread.run_sync(
        functools.partial(token_server, start_server, tmp_path)
    )
    issued: list[str] = []

    async def provider() -> str:
        issued.append(token(2, subscribe=["/Tok/**"], publish=["/Tok/**"]))
        return issued[-1]

    async with (
        connect([server.url], token_provider=provider, reconnect=FAST) as subscriber,
        connect([server.url], token=token(60, publish=["/Tok/**"]), reconnect=FAST) as publisher,
    ):
        subscription = subscriber.subscribe("/Tok/s")
        async for note in subscriber.notifications():
            if note.status is NotificationStatus.SUBSCRIBE_ALLOW:
                break
        contents = []
        deadline = trio.current_time() + 3.5
        sent = 0
        while trio.current_time() < deadline:  # across at least one expiry
            result = await publisher.publish("/Tok/s", f"m{sent}")
            assert result.ok, result
            sent += 1
            await trio.sleep(0.05)
        while len(contents) < sent:
            message = await subscription.next_message()
            contents.append(message.content)
        assert contents == [f"m{i}".encode() for i in range(sent)]  # no gap, no duplicate
        assert len(issued) >= 2  # at least one reconnect with a fresh token
        denied = await publisher.publish("/Other/s", "x")
        assert denied.status.value == "PUBLISH_DENIED"
