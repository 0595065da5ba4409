"""Ctrl-C in a command-line tool: one line and exit status 130, never a traceback.
And a reader that went away (``migratory sub ... | head -1``): exit 141 without a word,
as a tool killed by SIGPIPE (Python ignores SIGPIPE: a write raised BrokenPipeError,
a traceback, from deep inside trio).

A tool's ``__main__`` calls :func:`exit_on_sigint` before its own imports (pyspark,
trio, the chaos runner: up to a second): a SIGINT then ends the process with one line,
from the middle of an import, as it would at the prompt of any Unix tool. :func:`run`
puts Python's ``KeyboardInterrupt`` back for the command itself (its ``finally``
blocks and ``except KeyboardInterrupt`` clean up: children stopped, files closed) and
turns the one that reaches it into the same line. Only the interpreter's own first
milliseconds (before the first line of ``__main__``) keep Python's default. A tool
started with SIGINT ignored (a background job of a script: ``tool &``, nohup) keeps
ignoring it, as Python itself and every Unix tool do: Ctrl-C is meant for the
foreground job only.
(``migratory serve`` has its own rules: a stop signal is a clean stop, exit 0;
:mod:`migratory.stop_signals`.)
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C ended
BROKEN_PIPE = 141  # 128 + SIGPIPE


def say(prog: str) -> None:
    print(f"{prog}: interrupted (Ctrl-C)", file=sys.stderr, flush=True)


def exit_on_sigint(prog: str) -> None:
    """From now on SIGINT exits at once: ``PROG: interrupted (Ctrl-C)``, status 130
    (unless SIGINT is ignored: then it stays ignored)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return

    def _exit(signum: int, frame: FrameType | None) -> None:
        say(prog)
        raise SystemExit(INTERRUPTED)

    signal.signal(signal.SIGINT, _exit)


def run(prog: str, main: Callable[[], int]) -> int:
    """``main()``'s status, or 130 with one line if Ctrl-C ends it."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return main()
    except BaseException as exc:
        code = exit_status(prog, exc)
        if code is None:
            raise
        return code


def exit_status(prog: str, exc: BaseException) -> int | None:
    """130 (after the line) for Ctrl-C, 141 for a reader gone; None for anything else."""
    if _only(exc, KeyboardInterrupt):
        say(prog)
        return INTERRUPTED
    if _only(exc, BrokenPipeError):
        # what is left in stdout's buffer goes nowhere, not into a second error at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE
    return None


def _only(exc: BaseException, kind: type[BaseException]) -> bool:
    """``exc`` is a ``kind``, or an exception group of nothing else (trio hands a task's
    exception over in one)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(kind)[1] is None
    return isinstance(exc, kind)
