"""Ctrl-C in a command-line tool: one line and exit status 130, never a traceback.

A tool's ``__main__`` calls :func:`exit_on_sigint` before its own imports (pyspark,
trio, the chaos runner: up to a second): a SIGINT then ends the process with one line,
from the middle of an import, as it would at the prompt of any Unix tool. :func:`run`
puts Python's ``KeyboardInterrupt`` back for the command itself (its ``finally``
blocks and ``except KeyboardInterrupt`` clean up: children stopped, files closed) and
turns the one that reaches it into the same line. Only the interpreter's own first
milliseconds (before the first line of ``__main__``) keep Python's default.
(``migratory serve`` has its own rules: a stop signal is a clean stop, exit 0;
:mod:`migratory.stop_signals`.)
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from types import FrameType

INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C ended


def say(prog: str) -> None:
    print(f"{prog}: interrupted (Ctrl-C)", file=sys.stderr, flush=True)


def exit_on_sigint(prog: str) -> None:
    """From now on SIGINT exits at once: ``PROG: interrupted (Ctrl-C)``, status 130."""

    def _exit(signum: int, frame: FrameType | None) -> None:
        say(prog)
        raise SystemExit(INTERRUPTED)

    signal.signal(signal.SIGINT, _exit)


def run(prog: str, main: Callable[[], int]) -> int:
    """``main()``'s status, or 130 with one line if Ctrl-C ends it."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return main()
    except BaseException as exc:
        if not is_interrupt(exc):
            raise
        say(prog)
        return INTERRUPTED


def is_interrupt(exc: BaseException) -> bool:
    """A ``KeyboardInterrupt``, alone or the only thing in an exception group (trio
    hands a task's over in one)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(KeyboardInterrupt)[1] is None
    return isinstance(exc, KeyboardInterrupt)
