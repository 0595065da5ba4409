"""SIGINT and SIGTERM before the server's event loop listens for them.

A server stops on SIGINT (Ctrl-C) or SIGTERM whenever it comes, and exits 0: the stop
was asked for, and done (README, "Starting and stopping"). Once the event loop runs, a
trio signal receiver takes them (``run_until_signalled``, the Workers supervisor). Before
that -- importing the server's modules (a second or two on a busy machine), reading the
configuration, building the server (a Custom entitlement plugin imports its module) --
Python's defaults were all there was: SIGTERM ended the process silently where it stood
(exit status -15, not a word), SIGINT raised ``KeyboardInterrupt`` wherever the
interpreter was, a traceback from the middle of an import.

``migratory serve`` installs :func:`raise_on_stop` on its first line: a stop signal
raises :class:`StopRequested` out of whatever start-up is doing (nothing is listening
and no file is written yet), which ``main`` turns into one line. Just before the event
loop starts, :func:`note_from_now` replaces it: a signal is only noted, never raised
inside trio's own code, and the receiver, once open, asks :func:`noted` and stops at
once. Python itself, before the first line of ``main`` (the interpreter's start: under
0.13 s on a 2-core box at load 21, up to 0.4 s beside a cluster test: README), still
has its defaults.

A raised stop can land where Python only prints an exception and goes on: a ``__del__``,
a weakref callback (importlib's module locks use one, so a SIGTERM in the middle of
importing a plugin can land there). So a raised signal is noted too, and
:func:`raise_on_stop` installs an unraisable hook that drops a :class:`StopRequested`
without a traceback: start-up goes on to the event loop, whose receiver finds it noted
and stops before it listens.

Once stopped, ``main`` ignores both (:func:`ignore_from_now`): a signal sent again
while the process exits changes nothing (exit 0 stays 0).
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_noted: list[signal.Signals] = []


class StopRequested(BaseException):
    """A stop signal came while the server was starting, before its event loop ran."""

    def __init__(self, signum: signal.Signals) -> None:
        super().__init__(signum.name)
        self.signum = signum


def _raise(signum: int, frame: FrameType | None) -> None:
    _noted.append(signal.Signals(signum))  # (in case the raise is swallowed: see above)
    note_from_now()  # once: a signal again while this one unwinds start-up is only noted
    raise StopRequested(signal.Signals(signum))


def _unraisable(unraisable: sys.UnraisableHookArgs) -> None:
    if isinstance(unraisable.exc_value, StopRequested):
        return  # noted by _raise: the event loop's receiver stops the server
    sys.__unraisablehook__(unraisable)


def _note(signum: int, frame: FrameType | None) -> None:
    _noted.append(signal.Signals(signum))


def raise_on_stop() -> None:
    """From now on SIGINT and SIGTERM raise :class:`StopRequested` (and are noted)."""
    sys.unraisablehook = _unraisable
    for signum in STOP_SIGNALS:
        signal.signal(signum, _raise)


def note_from_now() -> None:
    """From now on SIGINT and SIGTERM are only noted (the event loop starts: a trio
    signal receiver takes them over, and restores this when it closes)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _note)


def ignore_from_now() -> None:
    """The server has stopped (or could not start) and the process is leaving: from now
    on SIGINT and SIGTERM are ignored. Python's finalization puts back the default
    dispositions of the signals it handled before it tears down its modules (100-300 ms
    of a server's exit), and a stop signal sent again then -- a second Ctrl-C, a
    ``kill`` repeated, a supervisor's SIGINT after its SIGTERM -- killed the process
    (exit status -15 or -2) after its stop had been done and said. An ignored one stays
    ignored."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def noted() -> signal.Signals | None:
    """The first stop signal noted since :func:`note_from_now`, if any."""
    return _noted[0] if _noted else None
