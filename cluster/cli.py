"""The ``migratory`` command: serve, pub, sub, bench, cluster up/status.

This is the outermost layer: ``serve`` builds a single-node server or a cluster
member (:func:`cluster.members.build_node`) from the configuration. It lives in the
cluster package because it composes it; nothing under ``migratory/`` imports
``cluster/``. ``python -m cluster`` runs it too.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import TYPE_CHECKING, Any, cast

# Nothing heavy here: ``serve`` takes SIGINT and SIGTERM before it imports the server
# (migratory/stop_signals.py), so this module's own imports are the only ones before.
from migratory import interrupted, stop_signals

if TYPE_CHECKING:
    from migratory.config import Config as ConfigType


def _say(message: str) -> None:
    """``migratory: MESSAGE`` on stderr in one ``write``: ``Workers`` share the stream,
    and ``print`` writes the line and its newline apart when stderr is unbuffered
    (``PYTHONUNBUFFERED``): two workers refusing the same key ran their lines together."""
    sys.stderr.write(f"migratory: {message}\n")


def _error(message: str) -> None:
    """``migratory: MESSAGE`` on stderr, after every log line written before it."""
    from migratory.logs import write_directly

    write_directly()
    _say(message)


def _serve(args: argparse.Namespace) -> int:
    from migratory.config import ConfigError, load_config, parse_set_options
    from migratory.logs import configure_logging, write_directly

    try:
        text = _config_text(args)
        config = load_config(args.config, text=text, overrides=parse_set_options(args.set))
    except ConfigError as exc:
        _say(f"configuration error: {exc}")
        return 2
    configure_logging(config.log_level, config.log_format)
    try:
        return _serve_configured(args, config, text)
    except ConfigError as exc:  # found building the server: a token key file, a plugin
        _error(f"configuration error: {exc}")
        return 2
    finally:
        write_directly()  # (a traceback, if any, comes after the log lines)


def _serve_configured(args: argparse.Namespace, config: ConfigType, text: str | None) -> int:
    import trio

    from cluster.members import build_node
    from migratory.server.run import run_until_signalled

    try:
        if args.worker_index is not None:
            return _serve_worker(args, config)
        if config.workers > 1:
            return _supervise(args, config, text)
        server, roles = build_node(config)
        stop_signals.note_from_now()  # the event loop's signal receiver takes over
        trio.run(functools.partial(run_until_signalled, server, roles=roles))
    except (OSError, BaseExceptionGroup) as exc:
        error = _first_os_error(exc)
        if error is None:
            raise
        _error(error.strerror or str(error))
        return 1
    return 0


def _config_text(args: argparse.Namespace) -> str | None:
    """The config file's text. A worker reads it on its stdin: the file as its
    supervisor read it at start-up (cluster/workers.py), not as it may be now."""
    if args.config is None:
        return None
    if args.worker_index is not None:
        return sys.stdin.buffer.read().decode()
    from migratory.config import read_config_file

    return read_config_file(args.config)


def _supervise(args: argparse.Namespace, config: ConfigType, config_text: str | None) -> int:
    """``Workers`` > 1: this process sequences, N worker processes serve (docs/workers.md)."""
    import trio

    from cluster.workers import WorkerFailed, serve_args, supervise

    error, code = None, 1
    stop_signals.note_from_now()
    try:
        trio.run(supervise, config, serve_args(args.config, args.set), config_text)
    except* WorkerFailed as failed:
        first = failed.exceptions[0]
        error = str(first)
        code = 2 if isinstance(first, WorkerFailed) and first.code == 2 else 1  # 2: bad config
    except* trio.TooSlowError:
        error = "the workers were not ready within 60 s"
    if error is not None:
        _error(error)
        return code
    return 0


def _serve_worker(args: argparse.Namespace, config: ConfigType) -> int:
    """One worker, started by the supervising process (never by hand)."""
    import os

    import trio

    from cluster.worker import WorkerNode, thaw_when_orphaned
    from cluster.workers import SECRET_ENV
    from migratory.config_values import parse_address
    from migratory.server.run import run_until_signalled

    secret = os.environ.pop(SECRET_ENV, "")
    if not secret:
        _error(f"--worker-index needs {SECRET_ENV} (set by the supervisor)")
        return 2
    thaw_when_orphaned()  # before WorkerNode takes its supervisor's pid to watch
    node = WorkerNode(config, index=args.worker_index,
                      sequencer=parse_address(args.worker_sequencer), password=secret,
                      parent=args.worker_parent)
    # the worker prints its "listening" lines itself, once it has caught up
    stop_signals.note_from_now()
    trio.run(functools.partial(run_until_signalled, node.server, roles=[node], ready_line=False))
    return 0


def _first_os_error(exc: BaseException) -> OSError | None:
    """The OSError that stopped start-up (a port in use, an unusable directory), if any;
    trio hands errors of tasks over in exception groups."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first_os_error(inner)
            if found is not None:
                return found
    return None


class DefaultsShown(argparse.HelpFormatter):
    """``--help`` names each option's default, as docs/cli.md does (a flag's off aside)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        shown = action.default not in (None, [], argparse.SUPPRESS) and not isinstance(
            action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
        if shown and action.option_strings and "default" not in text:
            default = action.default
            text += f" (default: {default:g})" if isinstance(default, float) else (
                " (default: %(default)s)")
        return text


class Parser(argparse.ArgumentParser):
    """Every parser of the ``migratory`` command, its subcommands' too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsShown)
        super().__init__(*args, **kwargs)


SERVE_DESCRIPTION = (
    "The configuration: the defaults, then the --config file, then MIGRATORY_CFG_<KEY> "
    "variables, then --set (docs/config.md lists every key). SIGINT (Ctrl-C) stops the "
    "server at once, SIGTERM after a drain (DrainTime). Exit status: 0 stopped by SIGINT "
    "or SIGTERM, 1 could not start or stopped on its own, 2 a bad configuration or "
    "command line; the reason in one line 'migratory: ...'."
)


TOOLS = {"pub": "client", "sub": "client", "bench": "bench", "cluster": "cluster",
         "downgrade-dump": "downgrade-dump"}
"""The tools' commands, by the module that registers them (``pub`` and ``sub`` together)."""


def build_parser(*, command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command`` (the first word of one), that command's
    alone, when it is one: a server (or a worker of one) starting imports none of the
    tools' modules (clients, bench, cluster tooling: about 100 modules, a third of its
    start-up imports' CPU time), and ``pub`` or ``sub`` none of the others' (0.2 s of
    CPU a run: bench, cluster tooling, downgrade-dump)."""
    parser = Parser(prog="migratory", description="Real-time pub/sub messaging server and tools.")
    commands = cast("argparse._SubParsersAction[argparse.ArgumentParser]", parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=Parser))
    serve = commands.add_parser("serve", help="run a server", description=SERVE_DESCRIPTION)
    serve.add_argument("--config", metavar="FILE", help="config file (Key = Value lines)")
    serve.add_argument(
        "--set",
        metavar="Key=Value",
        action="append",
        default=[],
        help="override one config key (repeatable); see docs/config.md",
    )
    # a worker of a server with Workers > 1, started by its supervisor (cluster/workers.py)
    serve.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    serve.add_argument("--worker-sequencer", default="", help=argparse.SUPPRESS)
    serve.add_argument("--worker-parent", type=int, default=None, help=argparse.SUPPRESS)
    serve.set_defaults(func=_serve)
    wanted = {TOOLS[command]} if command in TOOLS else set() if command == "serve" else set(
        TOOLS.values())
    if "client" in wanted:
        from migratory.cli_client import add_client_commands

        add_client_commands(commands)
    if "bench" in wanted:
        from migratory.bench.cli import add_bench_command

        add_bench_command(commands)
    if "cluster" in wanted:
        from cluster.tooling import add_cluster_commands

        add_cluster_commands(commands)
    if "downgrade-dump" in wanted:
        from cluster import dump_downgrade

        dump_downgrade.add_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The exit status: ``serve`` 0 once stopped by SIGINT or SIGTERM (whenever it came,
    start-up included), 1 when it could not start or run (a port in use, an unusable
    ClusterDataDir, ...), 2 for a bad configuration or command line; the other
    commands 130 on Ctrl-C, with one line (``sub``, once subscribed, stops on it: 0)
    (README, "Starting and stopping")."""
    argv = sys.argv[1:] if argv is None else argv
    serving = argv[:1] == ["serve"]
    if serving:
        stop_signals.raise_on_stop()
    try:
        args = build_parser(command=argv[0] if argv else None).parse_args(argv)
        code: int = args.func(args)
    except stop_signals.StopRequested as stop:
        if "--worker-index" not in argv:  # (a worker's supervisor says it for all)
            _say(f"{stop.signum.name} received during start-up: stopped")
        return 0
    except BaseException as exc:
        stopped = interrupted.exit_status("migratory", exc)  # Ctrl-C, `| head`
        if stopped is None:
            raise
        return stopped
    finally:
        if serving:  # stopped: a signal again while Python exits must not kill it
            stop_signals.ignore_from_now()
    return code


if __name__ == "__main__":
    sys.exit(main())
