"""Client-side commands of the ``migratory`` CLI: ``pub`` and ``sub``, on the Python SDK."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

import trio

from migratory.model.message import Message, Qos
from migratory.secret_file import read_secret_file
from migratory_client import (
    MigratoryError,
    Notification,
    NotificationStatus,
    ReconnectPolicy,
    Subscription,
    connect,
)
from migratory_client.notifications import NotificationQueue

__all__ = ["TOKEN_ENV", "add_client_commands", "format_message", "format_notification"]

DEFAULT_SERVER = "ws://127.0.0.1:8800"
TOKEN_ENV = "MIGRATORY_TOKEN"  # the token off the command line, as --token-file
PUB_POLICY = ReconnectPolicy(initial_delay=0.2, max_delay=2.0, max_attempts=5, connect_timeout=5)


def add_client_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``pub`` and ``sub`` on the ``migratory`` command's subparsers."""
    pub = subparsers.add_parser("pub", help="publish one message and print its status")
    pub.add_argument("subject", metavar="SUBJECT", help="the subject (/Stocks/NYSE/IBM)")
    pub.add_argument("content", metavar="CONTENT", help="message content (UTF-8 text)")
    pub.add_argument("--field", action="append", default=[], type=_field, metavar="K=V",
                     help="a field of the message (repeatable)")
    pub.add_argument("--retained", action="store_true", help="make it the subject's snapshot")
    pub.add_argument("--qos", choices=[q.value for q in Qos], default=Qos.STANDARD.value,
                     help="the message's qos")
    pub.add_argument("--timeout", type=_positive_seconds, default=10.0, metavar="SECONDS",
                     help="how long to wait for the status")
    _add_connection_options(pub)
    pub.set_defaults(func=run_pub)

    sub = subparsers.add_parser(
        "sub",
        help="print messages as they come (notifications on stderr)",
        description="One line per message: TYPE SUBJECT epoch=E seq=S CONTENT k=v ...; "
        "CONTENT is the text, or hex when it is not printable UTF-8.",
    )
    sub.add_argument("subjects", nargs="+", metavar="SUBJECT", help="the subjects")
    sub.add_argument("--history", type=_count(0), default=0, metavar="N",
                     help="the last N cached messages first (type historical) instead of the "
                     "snapshot")
    sub.add_argument("--conflation", type=_count(0), default=0, metavar="MS",
                     help="conflation period in milliseconds (rounded down to a multiple of "
                     "100; 0: every message)")
    sub.add_argument("--count", type=_count(1), default=None, metavar="N",
                     help="stop after N messages")
    _add_connection_options(sub)
    sub.set_defaults(func=run_sub)


def _add_connection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        action="append",
        default=None,
        metavar="URL",
        help=f"'URL' or 'WEIGHT URL', repeatable (default {DEFAULT_SERVER})",
    )
    parser.add_argument("--token", default=None,
                        help="entitlement token (on the command line: visible to `ps`)")
    parser.add_argument("--token-file", default=None, metavar="FILE",
                        help=f"a file (mode 0600) holding the token; else {TOKEN_ENV}")
    parser.add_argument(
        "--ca-file", default=None, metavar="PEM",
        help="CA certificate(s) that sign the server's certificate (wss://)",
    )


def _field(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"field {text!r} must be NAME=VALUE")
    return name, value


def _positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0 seconds")
    return seconds


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: must be {minimum} or more")
        return value

    return parse


def _servers(args: argparse.Namespace) -> list[str]:
    return list(args.server or [DEFAULT_SERVER])


def _token(args: argparse.Namespace) -> str | None:
    """``--token``, else ``--token-file`` (mode 0600 or stricter), else MIGRATORY_TOKEN;
    ValueError naming the option when the file cannot give it."""
    if args.token is not None and args.token_file is not None:
        raise ValueError("give --token or --token-file, not both")
    if args.token_file is not None:
        return read_secret_file("--token-file", args.token_file)
    return args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None


# --- formatting ----------------------------------------------------------------


def _content_text(content: bytes) -> str:
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return content.hex()
    return text if text.isprintable() else content.hex()


def format_message(message: Message) -> str:
    parts = [
        message.type.value,
        message.subject,
        f"epoch={message.epoch}",
        f"seq={message.seq}",
        _content_text(message.content),
    ]
    parts += [f"{name}={value}" for name, value in message.fields.items()]
    return " ".join(parts)


def format_notification(note: Notification) -> str:
    parts = [note.status.value]
    if note.subject is not None:
        parts.append(note.subject)
    if note.position is not None:
        parts += [f"epoch={note.position.epoch}", f"seq={note.position.seq}"]
    if note.server is not None:
        parts.append(note.server)
    if note.reason:
        parts.append(f"({note.reason})")
    return " ".join(parts)


# --- pub -----------------------------------------------------------------------


def run_pub(args: argparse.Namespace) -> int:
    return trio.run(_publish, args, sys.stdout, sys.stderr)


async def _publish(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        async with connect(
            _servers(args), token=_token(args), name="migratory-pub", reconnect=PUB_POLICY,
            ca_file=getattr(args, "ca_file", None),
        ) as client:
            result = await client.publish(
                args.subject,
                args.content,
                dict(args.field),
                retained=args.retained,
                qos=Qos(args.qos),
                timeout=args.timeout,
            )
    except (MigratoryError, ValueError, OSError) as exc:
        print(f"migratory pub: {exc}", file=err)
        return 1
    line = f"{result.status.value} {result.subject}"
    if result.position is not None:
        line += f" epoch={result.position.epoch} seq={result.position.seq}"
    print(line, file=out, flush=True)
    if not result.ok:
        print(f"migratory pub: {result.status.value}: {result.reason or '-'}", file=err)
        return 1
    return 0


# --- sub -----------------------------------------------------------------------


def run_sub(args: argparse.Namespace) -> int:
    """Runs until ``--count`` messages or Ctrl-C (exit code 0), a terminal error or every
    subject denied (1)."""
    return trio.run(_subscribe_until_interrupted, args, sys.stdout, sys.stderr)


async def _subscribe_until_interrupted(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    exit_code = 0
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for _ in signals:
                    nursery.cancel_scope.cancel()

            async def subscribe() -> None:
                nonlocal exit_code
                exit_code = await subscribe_and_print(args, out, err)
                nursery.cancel_scope.cancel()

            nursery.start_soon(stop_on_signal)
            nursery.start_soon(subscribe)
    return exit_code


async def subscribe_and_print(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Print messages on ``out`` and notifications on ``err``; returns the exit code."""
    try:
        async with connect(
            _servers(args), token=_token(args), name="migratory-sub",
            ca_file=getattr(args, "ca_file", None),
        ) as client:
            subscription = client.subscribe(
                *args.subjects, history=args.history, conflation_ms=args.conflation
            )
            exit_code = 1  # unless the messages end it: every subject denied ends it first
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_print_notifications, client.notifications(), err,
                                   args.subjects, nursery.cancel_scope)
                exit_code = await _print_messages(subscription, args.count, out, err)
                nursery.cancel_scope.cancel()
    except (MigratoryError, ValueError, OSError) as exc:
        print(f"migratory sub: {exc}", file=err, flush=True)
        return 1
    return exit_code


async def _print_messages(
    subscription: Subscription, count: int | None, out: TextIO, err: TextIO
) -> int:
    printed = 0
    try:
        async for message in subscription:
            print(format_message(message), file=out, flush=True)
            printed += 1
            if count is not None and printed >= count:
                break
    except MigratoryError as exc:
        print(f"migratory sub: {exc}", file=err, flush=True)
        return 1
    return 0


async def _print_notifications(
    notes: NotificationQueue, err: TextIO, subjects: Sequence[str], stop: trio.CancelScope
) -> None:
    """Print each notification; once every subject is denied nothing can come: say so
    and end the command (``stop``) -- it used to wait for ever, silent after the denials."""
    denied: set[str | None] = set()
    try:
        async for note in notes:
            print(format_notification(note), file=err, flush=True)
            if note.status is NotificationStatus.SUBSCRIBE_DENY:
                denied.add(note.subject)
                if denied.issuperset(subjects):
                    print("migratory sub: every subject was denied (SUBSCRIBE_DENY)", file=err,
                          flush=True)
                    stop.cancel()
                    return
    except MigratoryError:
        pass  # the message loop reports it
