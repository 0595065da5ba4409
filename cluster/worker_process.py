"""A worker process as its supervisor runs it (``Workers = N``, docs/workers.md), started
from the supervisor's own thread -- the event loop's -- not from a thread of trio's
cache, as ``trio.lowlevel.open_process`` does.

Linux sends a process's parent-death signal (``PR_SET_PDEATHSIG``, which each worker
asks for: :func:`cluster.worker.thaw_when_orphaned`) when the *thread* that started it
ends, not only the process. trio's cached threads end after 10 s idle, so a worker
started by one got its SIGCONT then, with its supervisor alive: a worker held with
SIGSTOP (a test of hang detection, an operator's debugger) was let go 10 s after its
start (``tests/cluster/test_worker_process.py``). Started from the thread that runs the
supervisor until it exits, a worker gets the signal only when the supervisor is gone.

The start itself blocks the event loop for the fork and exec (``vfork``: 1.7 ms median
from a process holding 300 MB, docs/workers.md), once per worker start; the waiting
(a pidfd) and the pipes are trio's.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

import trio

POLL_SECONDS = 0.05
"""How often :meth:`WorkerProcess.wait` looks, where there is no pidfd (not Linux)."""


class WorkerProcess:
    """A started worker: its pid, its stdout (and stdin, if piped) as trio streams, and
    its exit status."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdout: trio.lowlevel.FdStream | None = None
        self.stdin: trio.lowlevel.FdStream | None = None
        if popen.stdout is not None:
            self.stdout = trio.lowlevel.FdStream(os.dup(popen.stdout.fileno()))
            popen.stdout.close()
        if popen.stdin is not None:
            self.stdin = trio.lowlevel.FdStream(os.dup(popen.stdin.fileno()))
            popen.stdin.close()

    @classmethod
    def start(
        cls, command: Sequence[str], *, env: Mapping[str, str], stdin: bool
    ) -> WorkerProcess:
        """Start ``command`` in its own session, stdout piped (and stdin, if ``stdin``),
        from this thread. OSError if it cannot be started (EMFILE, EAGAIN, ENOMEM)."""
        popen = subprocess.Popen(
            list(command), stdout=subprocess.PIPE, env=dict(env), start_new_session=True,
            stdin=subprocess.PIPE if stdin else None,
        )
        return cls(popen)

    @property
    def returncode(self) -> int | None:
        """Its exit status (negative: the signal that ended it); None while it runs."""
        return self._popen.poll()

    async def wait(self) -> int:
        """Until it has exited: its exit status. Several tasks may wait at once."""
        while self._popen.returncode is None:
            try:
                pidfd = os.pidfd_open(self.pid)
            except (AttributeError, OSError):  # no pidfd here (or reaped: poll says so)
                if self._popen.poll() is None:
                    await trio.sleep(POLL_SECONDS)
                continue
            try:
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                os.close(pidfd)
            self._popen.poll()
        return self._popen.returncode

    def send_signal(self, signum: int) -> None:
        """``signum`` to it, unless it has exited (its pid may be another's by now)."""
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def aclose_streams(self) -> None:
        """Close its pipes (they would otherwise wait for the garbage collector)."""
        for stream in (self.stdin, self.stdout):
            if stream is not None:
                await stream.aclose()
