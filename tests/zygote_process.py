"""``python -m cluster serve ...`` for the tests, forked from this pytest process's zygote.

:func:`start_cluster_process` returns a :class:`ForkedProcess` (Popen's pid, args,
returncode, poll, wait, send_signal, terminate, kill, stdout) forked by ``tests/zygote.py``
-- what it keeps and what it cannot, there -- or a ``subprocess.Popen`` when a fork
would not be the same process: another command or interpreter, another cwd, values of
what the interpreter reads at its start (``PYTHON*``, locale, ``TZ``) other than the
zygote's, or ``MIGRATORY_TESTS_EXEC=1`` in the tests' environment (every member exec'd:
to compare). Signals go through a pidfd (a reused pid is never signalled).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

ZYGOTE = Path(__file__).with_name("zygote.py")
EXEC_ENV = "MIGRATORY_TESTS_EXEC"
"""``1``: every member and server the tests start is exec'd (no zygote)."""
READ_AT_START = ("PYTHON", "LC_", "LANG", "TZ")
"""Environment variables (prefixes) the interpreter reads when it starts."""
EXIT_REPORT_WAIT = 10.0
"""Seconds for the zygote's report of a child that has ended."""

Stream = int | IO[Any] | None


def read_at_start(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(READ_AT_START)}


_STARTER = ThreadPoolExecutor(1, thread_name_prefix="zygote-starter")
"""The thread every zygote is started from (it lives as long as this process): a zygote
dies with the thread that started it (``PR_SET_PDEATHSIG`` is a thread's), and a test
may start the first one from a thread that ends -- trio's worker threads end after 10 s
idle (``test_sdk_against_server.py`` starts its server in one); the zygote was then
SIGKILLed, its children's exit statuses lost."""


class ZygoteGone(RuntimeError):
    """The zygote ended: its children's exit statuses are lost."""


class Zygote:
    """The test side of ``tests/zygote.py``: one per pytest process."""

    def __init__(self, python: str = sys.executable, env: dict[str, str] | None = None,
                 path0: str | None = None) -> None:
        """``python``, ``env``: the interpreter and environment the zygote (so each child)
        starts with (this process's); ``path0``: its ``sys.path[0]`` for its imports
        (this cwd: what ``python -m cluster`` has)."""
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = dict(os.environ) if env is None else env
        self.locale: dict[str, str] = {}
        """The zygote's locale variables once started: ``env``'s and what the
        interpreter's start added (``LC_CTYPE``: PEP 538's coercion of the C locale)."""
        self.cwd = os.getcwd()
        self.process = _STARTER.submit(
            subprocess.Popen,
            [python, str(ZYGOTE), str(theirs.fileno()), str(os.getpid()),
             *([] if path0 is None else [path0])],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            env=env,
        ).result()
        theirs.close()
        self.lock = threading.Lock()
        self.changed = threading.Condition()
        self.started: dict[int, tuple[int, int]] = {}
        """child number -> (pid, pidfd), until its starter takes it."""
        self.statuses: dict[int, int] = {}
        """child number -> wait status, until its process takes it."""
        self.numbers = 0
        self.gone = False
        self.ready = threading.Event()
        threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()
        if not self.ready.wait(60) or self.gone:
            raise ZygoteGone(f"the zygote did not start (exit {self.process.poll()})")

    def _read(self) -> None:
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(self.control, 1 << 16, 1)
            except OSError:
                message, fds = b"", []
            if not message:
                break
            said = json.loads(message)
            with self.changed:
                if "ready" in said:
                    self.locale = said["locale"]
                    self.ready.set()
                elif "pid" in said:
                    self.started[said["number"]] = (said["pid"], fds[0])
                else:
                    self.statuses[said["number"]] = said["status"]
                self.changed.notify_all()
        with self.changed:
            self.gone = True
            self.ready.set()
            self.changed.notify_all()

    def fork(self, argv: list[str], env: dict[str, str], fds: list[int]) -> tuple[int, int, int]:
        """(child number, pid, pidfd) of a child that becomes ``argv``."""
        with self.lock:
            self.numbers += 1
            number = self.numbers
        request = {"number": number, "argv": argv, "env": env, "cwd": self.cwd}
        socket.send_fds(self.control, [json.dumps(request).encode()], fds)
        with self.changed:
            self.changed.wait_for(lambda: number in self.started or self.gone, 60)
            if number not in self.started:
                raise ZygoteGone("the zygote did not fork")
            pid, pidfd = self.started.pop(number)
        return number, pid, pidfd

    def status(self, number: int, timeout: float | None) -> int | None:
        with self.changed:
            self.changed.wait_for(lambda: number in self.statuses or self.gone, timeout)
            if number in self.statuses:
                return self.statuses.pop(number)
            if self.gone:
                raise ZygoteGone(f"the zygote ended before its child {number}")
            return None

    def close(self) -> None:
        """EOF to the zygote; waited for, so that its children's CPU is this process's
        (RUSAGE_CHILDREN, ``time -v``)."""
        if self.process.returncode is not None:
            return
        with contextlib.suppress(OSError):
            self.control.shutdown(socket.SHUT_RDWR)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ForkedProcess:
    """What the tests use of a ``subprocess.Popen``, for a child of the zygote."""

    def __init__(self, zygote: Zygote, args: list[str], env: dict[str, str], fds: list[int],
                 stdout: IO[bytes] | None) -> None:
        self.args = args
        self.stdin: IO[bytes] | None = None
        self.stdout = stdout
        self.stderr: IO[bytes] | None = None
        self.returncode: int | None = None
        self._zygote = zygote
        self._number, self.pid, self._pidfd = zygote.fork(args, env, fds)

    def _ended(self, status: int | None) -> int | None:
        if status is not None and self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(status)
            os.close(self._pidfd)
        return self.returncode

    def poll(self) -> int | None:
        """The exit code once the process has ended (its pidfd readable), as Popen's."""
        if self.returncode is None:
            readable, _, _ = select.select([self._pidfd], [], [], 0)
            wait = EXIT_REPORT_WAIT if readable else 0
            self._ended(self._zygote.status(self._number, wait))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._ended(self._zygote.status(self._number, timeout))
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # ended, not yet reported
                signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> ForkedProcess:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.stdout is not None:
            self.stdout.close()
        self.wait()


MemberProcess = ForkedProcess | subprocess.Popen[bytes]
"""A member or server process the tests started, forked or exec'd."""

_zygote: list[Zygote] = []
_zygote_lock = threading.Lock()


def the_zygote() -> Zygote:
    """This pytest process's zygote (started at the first call)."""
    with _zygote_lock:
        if not _zygote or _zygote[0].gone:
            _zygote[:] = [Zygote()]
            atexit.register(_zygote[0].close)
        return _zygote[0]


def close_the_zygote() -> None:
    """At the end of the session: the zygote's children's CPU is then this process's
    (an xdist worker may leave without its atexit hooks)."""
    with _zygote_lock:
        if _zygote:
            _zygote.pop().close()


def forkable(args: list[str], env: dict[str, str], cwd: str | None) -> bool:
    if os.environ.get(EXEC_ENV) == "1" or len(args) < 3 or args[0] != sys.executable:
        return False
    if args[1:3] != ["-m", "cluster"] and args[1] != "-c":
        return False
    if cwd is not None and os.path.realpath(cwd) != os.path.realpath(os.getcwd()):
        return False
    return read_at_start(env) == read_at_start(os.environ)


def _descriptor(stream: Stream, default: int, opened: list[int]) -> int:
    if stream is None:
        return default
    if stream == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        opened.append(fd)
        return fd
    return stream if isinstance(stream, int) else stream.fileno()


def start_cluster_process(
    args: list[str], *, env: dict[str, str], stdin: Stream = None, stdout: Stream = None,
    stderr: Stream = None, cwd: str | None = None,
) -> MemberProcess:
    """``subprocess.Popen(args, stdin=, stdout=, stderr=, env=)`` of ``python -m cluster
    ...`` (or ``python -c CODE``): forked from the zygote where that is the same process,
    else exec'd."""
    if not forkable(args, env, cwd):
        return subprocess.Popen(args, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd)
    zygote = the_zygote()
    if read_at_start(env) != read_at_start(zygote.env) or os.getcwd() != zygote.cwd:
        return subprocess.Popen(args, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd)
    opened: list[int] = []
    pipe: IO[bytes] | None = None
    try:
        fds = [_descriptor(stdin, 0, opened), -1, _descriptor(stderr, 2, opened)]
        if stdout == subprocess.PIPE:
            read_end, fds[1] = os.pipe()
            opened.append(fds[1])
            pipe = open(read_end, "rb")  # noqa: SIM115 (the process's, as Popen's)
        else:
            fds[1] = _descriptor(stdout, 1, opened)
        return ForkedProcess(zygote, args, env, fds, pipe)
    except BaseException:
        if pipe is not None:
            pipe.close()
        raise
    finally:
        for fd in opened:
            os.close(fd)
