"""``migratory pub`` / ``migratory sub`` against a fake server."""

from __future__ import annotations

import argparse
import io
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from sdk_fake_server import start_servers, trio_test, update

from migratory.cli_client import (
    TOKEN_ENV,
    _publish,
    add_client_commands,
    format_message,
    subscribe_and_print,
)
from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory_client import Notification, NotificationStatus, Status


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="migratory")
    add_client_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(list(argv))


def test_arguments_and_defaults() -> None:
    args = parse("pub", "/a/b", "hi", "--field", "k=v=w", "--retained", "--qos", "guaranteed")
    assert (args.field, args.retained, args.qos, args.server) == (
        [("k", "v=w")],
        True,
        "guaranteed",
        None,
    )
    args = parse("sub", "/a/b", "/c/d", "--history", "3", "--count", "2", "--server", "50 ws://x")
    assert (args.subjects, args.history, args.count, args.server) == (
        ["/a/b", "/c/d"],
        3,
        2,
        ["50 ws://x"],
    )
    assert callable(args.func)


def test_message_line() -> None:
    text = Message("/a/b", b"hello world", {"k": "v"}, epoch=3, seq=9, type=MessageType.RECOVERED)
    assert format_message(text) == "recovered /a/b epoch=3 seq=9 hello world k=v"
    binary = Message("/a/b", b"\xff\x00", epoch=3, seq=9)
    assert format_message(binary) == "update /a/b epoch=3 seq=9 ff00"
    assert format_message(Message("/a/b", b"two\nlines")).endswith(b"two\nlines".hex())


def test_notification_line() -> None:
    from migratory.cli_client import format_notification

    note = Notification(NotificationStatus.DATA_SYNC, "/a/b", Position(3, 4), None, "ws://s")
    assert format_notification(note) == "DATA_SYNC /a/b epoch=3 seq=4 ws://s"


@trio_test
async def test_pub_prints_the_status() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)

        async def answer(status: Status, reason: str | None) -> None:
            conn = await server.next_connection()
            await conn.accept_session()
            publish = await conn.expect(ops.Publish)
            assert publish.message.fields == {"k": "v"} and publish.message.retained
            position = Position(5, 6) if status is Status.PUBLISH_OK else None
            closure = publish.message.closure
            await conn.send(ops.PublishStatus(status, closure, "/a/b", position, reason))

        args = parse("pub", "/a/b", "x", "--field", "k=v", "--retained", "--server", server.url)
        nursery.start_soon(answer, Status.PUBLISH_OK, None)
        out, err = io.StringIO(), io.StringIO()
        assert await _publish(args, out, err) == 0
        assert out.getvalue() == "PUBLISH_OK /a/b epoch=5 seq=6\n"

        nursery.start_soon(answer, Status.PUBLISH_DENIED, "not allowed")
        out, err = io.StringIO(), io.StringIO()
        assert await _publish(args, out, err) == 1
        assert out.getvalue() == "PUBLISH_DENIED /a/b\n"
        assert "not allowed" in err.getvalue()
        nursery.cancel_scope.cancel()


@trio_test
async def test_sub_prints_count_messages_and_notifications() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)

        async def serve() -> None:
            conn = await server.next_connection()
            await conn.accept_session()
            await conn.expect(ops.Subscribe)
            await conn.allow("/a/b", 7, 0)
            await conn.deliver(update("/a/b", 1), update("/a/b", 2), update("/a/b", 3))

        nursery.start_soon(serve)
        args = parse("sub", "/a/b", "--count", "2", "--server", server.url)
        out, err = io.StringIO(), io.StringIO()
        assert await subscribe_and_print(args, out, err) == 0
        assert out.getvalue().splitlines() == [
            "update /a/b epoch=7 seq=1 /a/b#1",
            "update /a/b epoch=7 seq=2 /a/b#2",
        ]
        assert f"SERVER_UP {server.url}" in err.getvalue()
        nursery.cancel_scope.cancel()


@trio_test
async def test_sub_reports_a_terminal_close() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)

        async def deny() -> None:
            conn = await server.next_connection()
            await conn.close(4003, "who are you")

        nursery.start_soon(deny)
        out, err = io.StringIO(), io.StringIO()
        assert (
            await subscribe_and_print(parse("sub", "/a/b", "--server", server.url), out, err) == 1
        )
        assert "4003" in err.getvalue() and "who are you" in err.getvalue()
        nursery.cancel_scope.cancel()


@trio_test
async def test_sub_ends_when_every_subject_is_denied() -> None:
    """``migratory sub /migratory/cluster`` without the MonitorToken: SUBSCRIBE_DENY,
    then nothing would ever come. Before: it waited for ever after the denial line; one
    subject allowed among them still waits for its messages."""
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)

        async def serve(allowed: set[str]) -> None:
            conn = await server.next_connection()
            await conn.accept_session()
            subscribe = await conn.expect(ops.Subscribe)
            for entry in subscribe.subscriptions:
                if entry.subject in allowed:
                    await conn.allow(entry.subject, 7, 0)
                else:
                    await conn.send(ops.SubjectStatus(ops.Status.SUBSCRIBE_DENY, entry.subject,
                                                      reason="not entitled to subscribe"))
            if allowed:
                await conn.deliver(update("/a/b", 1))

        nursery.start_soon(serve, set())
        args = parse("sub", "/a/b", "/c/d", "--server", server.url)
        out, err = io.StringIO(), io.StringIO()
        with trio.fail_after(30):  # (a guard against the hang only)
            assert await subscribe_and_print(args, out, err) == 1
        assert out.getvalue() == ""
        assert err.getvalue().splitlines()[1:] == [
            f"SUBSCRIBE_DENY /a/b {server.url} (not entitled to subscribe)",
            f"SUBSCRIBE_DENY /c/d {server.url} (not entitled to subscribe)",
            "migratory sub: every subject was denied (SUBSCRIBE_DENY)",
        ]
        nursery.start_soon(serve, {"/a/b"})
        args = parse("sub", "/a/b", "/c/d", "--count", "1", "--server", server.url)
        out, err = io.StringIO(), io.StringIO()
        assert await subscribe_and_print(args, out, err) == 0
        assert out.getvalue() == "update /a/b epoch=7 seq=1 /a/b#1\n"
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def sub_process_with_one_message() -> AsyncIterator[tuple[trio.Process, Any]]:
    """``migratory sub /a/b`` against a fake server, once it has printed one update:
    the process and the server's connection to it (killed at the end if still running)."""
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        command = [sys.executable, "-m", "cluster", "sub", "/a/b", "--server", server.url]
        process = await trio.lowlevel.open_process(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            conn = await server.next_connection()
            await conn.accept_session()
            await conn.expect(ops.Subscribe)
            await conn.allow("/a/b", 7, 0)
            await conn.deliver(update("/a/b", 1))
            assert process.stdout is not None and process.stderr is not None
            line = b""
            while not line.endswith(b"\n"):
                line += await process.stdout.receive_some(1000)
            assert line == b"update /a/b epoch=7 seq=1 /a/b#1\n"
            yield process, conn
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        nursery.cancel_scope.cancel()


async def stderr_of(process: trio.Process) -> bytes:
    assert process.stderr is not None
    errors = b""
    while chunk := await process.stderr.receive_some(10000):
        errors += chunk
    return errors


@trio_test
async def test_sub_exits_cleanly_on_ctrl_c() -> None:
    async with sub_process_with_one_message() as (process, _):
        process.send_signal(signal.SIGINT)
        assert await process.wait() == 0
        assert b"Traceback" not in await stderr_of(process)


@trio_test
async def test_sub_whose_reader_went_away_exits_141_without_a_traceback() -> None:
    """``migratory sub ... | head -1``: the next message's write raised BrokenPipeError
    inside trio's nursery -- an exception-group traceback, exit 1."""
    async with sub_process_with_one_message() as (process, conn):
        assert process.stdout is not None
        await process.stdout.aclose()  # the reader goes, as head -1 does
        await conn.deliver(update("/a/b", 2))
        with trio.fail_after(30):  # (a guard against a hang only)
            assert await process.wait() == 141
        errors = await stderr_of(process)
        assert b"Traceback" not in errors, errors.decode()


def test_bad_numbers_are_refused_naming_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in (
        (("pub", "/a/b", "x", "--timeout", "-1"), "--timeout: '-1': must be more than 0"),
        (("pub", "/a/b", "x", "--timeout", "nan"), "--timeout: 'nan': must be more than 0"),
        (("sub", "/a/b", "--history", "-1"), "--history: '-1': must be 0 or more"),
        (("sub", "/a/b", "--count", "0"), "--count: '0': must be 1 or more"),
        (("sub", "/a/b", "--conflation", "soon"), "--conflation: 'soon' is not a whole"),
    ):
        with pytest.raises(SystemExit):
            parse(*argv)
        assert message in capsys.readouterr().err


@trio_test
async def test_a_ca_file_that_is_missing_or_holds_no_certificate_is_named(tmp_path: Path) -> None:
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("just text\n")
    for path, reason in ((str(not_pem), "no PEM certificate in it"),
                         ("/nonexistent/ca.pem", "No such file or directory")):
        out, err = io.StringIO(), io.StringIO()
        args = parse("pub", "/a/b", "x", "--server", "wss://127.0.0.1:1", "--ca-file", path)
        assert await _publish(args, out, err) == 1
        assert err.getvalue() == f"migratory pub: CA file {path!r}: {reason}" + (
            " (NO_CERTIFICATE_OR_CRL_FOUND)\n" if path == str(not_pem) else "\n")


@trio_test
async def test_a_token_comes_from_a_file_or_the_environment_not_only_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--token`` puts the token on the command line, where every user of the machine
    reads it (``ps``); cluster up keeps its password off it (``--password-file``, mode
    0600, or an environment variable). pub and sub take ``--token-file`` and
    MIGRATORY_TOKEN the same way; a file others can read, an empty one or two sources at
    once are refused naming the option."""
    secret = tmp_path / "token"
    secret.write_text("from-file\n")
    secret.chmod(0o600)
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)

        async def token_sent() -> str | None:
            conn = await server.next_connection()
            connect = await conn.accept_session()
            publish = await conn.expect(ops.Publish)
            await conn.send(ops.PublishStatus(Status.PUBLISH_OK, publish.message.closure,
                                              "/a/b", Position(1, 1), None))
            return connect.token

        async def token_of(*argv: str) -> str | None:
            sent: list[str | None] = []

            async def serve() -> None:
                sent.append(await token_sent())

            nursery.start_soon(serve)
            args = parse("pub", "/a/b", "x", "--server", server.url, *argv)
            out, err = io.StringIO(), io.StringIO()
            assert await _publish(args, out, err) == 0, err.getvalue()
            return sent[0]

        monkeypatch.delenv(TOKEN_ENV, raising=False)
        assert await token_of() is None
        assert await token_of("--token-file", str(secret)) == "from-file"
        monkeypatch.setenv(TOKEN_ENV, "from-env")
        assert await token_of() == "from-env"
        assert await token_of("--token-file", str(secret)) == "from-file"  # the option wins
        assert await token_of("--token", "on-the-line") == "on-the-line"
        nursery.cancel_scope.cancel()
    shared, empty = tmp_path / "shared", tmp_path / "empty"
    shared.write_text("t\n")
    shared.chmod(0o644)
    empty.write_text("\n")
    empty.chmod(0o600)
    for argv, reason in (
        (("--token-file", str(shared)), f"--token-file {shared} can be read by other users"),
        (("--token-file", str(empty)), f"--token-file {empty} is empty"),
        (("--token-file", str(tmp_path / "none")), "No such file or directory"),
        (("--token", "t", "--token-file", str(secret)), "give --token or --token-file"),
    ):
        for command in ("pub", "sub"):
            out, err = io.StringIO(), io.StringIO()
            args = parse(command, "/a/b", *(("x",) if command == "pub" else ()),
                         "--server", "ws://127.0.0.1:1", *argv)
            run = _publish if command == "pub" else subscribe_and_print
            assert await run(args, out, err) == 1
            assert err.getvalue().startswith(f"migratory {command}: ") and reason in err.getvalue()


@trio_test
async def test_pub_to_a_server_that_is_down_says_why_in_one_line() -> None:
    """Before: ``last: cannot connect: OSError('all attempts to connect to ... failed')``
    and, with a ``--timeout`` shorter than the attempts, no reason at all."""
    import socket

    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    refused = f"all attempts to connect to 127.0.0.1:{port} failed: Connection refused"
    last = f"last: cannot connect: {refused}"
    for extra, told in (([], f"no server reachable after 5 attempts; {last}"),
                        (["--timeout", "0.5"],
                         f"not published to /a/b: no server session within 0.5 s; {last}")):
        out, err = io.StringIO(), io.StringIO()
        args = parse("pub", "/a/b", "x", "--server", f"ws://127.0.0.1:{port}", *extra)
        assert await _publish(args, out, err) == 1
        assert (out.getvalue(), err.getvalue()) == ("", f"migratory pub: {told}\n")
