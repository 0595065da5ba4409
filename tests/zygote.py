"""The tests' fork server ("zygote"): member processes without their ~0.4 s of imports.

A member or server the tests start (``python -m cluster serve ...``) spent ~0.37-0.6 s
of CPU starting and stopping, ~80 % of it importing ~400 modules; ~800 of them in a
``make test`` (the CI of e554b77: ~250-300 CPU-s of its ~1,900). This process is started
once per pytest process (``tests/zygote_process.py``), imports what a member imports
(:data:`PRELOADED`), and on each request forks a child that becomes what
``python -m cluster serve <args>`` would be: its argv (``sys.argv``, ``sys.orig_argv``),
its environment (replaced whole), its cwd, its stdin/stdout/stderr (descriptors passed
with the request), every other descriptor closed, fresh ``sys.std*`` objects buffered
as an exec'd interpreter's, the signal dispositions this interpreter started with, then
``runpy._run_module_as_main("cluster")`` (what ``python -m`` runs: ``sys.argv[0]`` and
``__main__`` stay the module's, for atexit hooks too) in a fresh ``__main__`` at the top
level of this script and a normal interpreter exit (atexit, thread joins, flushes).
(``-c CODE`` too: what ``tests/test_zygote.py`` runs; and ``python SCRIPT <args>`` in
a pod's network, UTS and mount namespaces, held until the pod is released:
:func:`enter_pod`, for ``tests/deploy/pod_fork.py``, whose zygote is started with the
pod's interpreter, environment and ``sys.path[0]``.)

The zygote is the children's parent: a child subreaper (it also reaps the orphans of
its children, as init would), it reports each child's exit status to the test process,
dies with it (PR_SET_PDEATHSIG) and exits at EOF of its control socket, SIGKILLing the
children left.

What a fork cannot make exactly as an exec (checked, h174):

- Interpreter start-up itself: ``PYTHON*``, ``LC_*``, ``LANG`` and ``TZ`` are read when
  the interpreter starts (``PYTHONDONTWRITEBYTECODE``, ``PYTHONPYCACHEPREFIX`` of
  ``make test``, locale, hash seed, time zone). The test side forks only when the
  child's values are the zygote's, else it execs (``zygote_process.py``).
- Hash randomization: every child of one zygote has the zygote's hash seed (set and
  dict-of-str iteration orders alike across the members of a run; a different seed
  each run, as before). Accepted: no test or member relies on two members differing.
- ``/proc/PID/cmdline`` (``ps``) shows this script's argv, not the member's. Nothing
  reads a member's cmdline (``test_cluster_up.py`` reads the members of
  ``migratory cluster up``, which are exec'd; ``test_workers_sync_kill.py`` a Worker's,
  which a member execs); ``sys.orig_argv`` is the member's.
- Import-time state of the product: the modules of :data:`PRELOADED` keep no
  per-process value at import (no module-level ``time.monotonic()``, ``os.getpid()``,
  thread or open file; ``migratory.model.position`` keeps a ``SystemRandom``, which
  reads the kernel each time; ``random`` reseeds at fork). Their
  ``os.register_at_fork`` hooks: ``migratory/logs.py``'s ``_direct`` does nothing
  without a log writer (none before ``configure_logging``); ``cluster/dump_fork.py``'s
  is registered by a Raft node at its start, never here. The zygote checks it has one
  thread after its imports and refuses to serve otherwise.
- ``gc.freeze()`` before the first fork: a child's finalization then leaves the
  zygote's objects alone (it copied the whole heap: ~0.17 s of CPU per child, now
  ~0.05). A member freezes everything at its start anyway
  (``migratory/server/gc_pauses.py``); only collections before that differ.
- Tests whose subject is the interpreter's start (imports held back, signals during
  start-up, bytecode, start-up time) keep an exec: ``LocalCluster(exec_members=True)``,
  ``start_server(exec_server=True)``; faulty and old-version members always exec.
"""

from __future__ import annotations

import signal

START_SIGNALS = {
    sig: signal.getsignal(sig)
    for sig in signal.valid_signals()
    if sig not in (signal.SIGKILL, signal.SIGSTOP)
}
"""The dispositions this interpreter started with (as an exec'd one would have them)."""

import contextlib  # noqa: E402
import ctypes  # noqa: E402
import gc  # noqa: E402
import importlib.machinery  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import runpy  # noqa: E402
import select  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import types  # noqa: E402
from typing import Any  # noqa: E402

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
NAMESPACES = (0x40000000, 0x04000000, 0x00020000)
"""CLONE_NEWNET, CLONE_NEWUTS, CLONE_NEWNS: the order of the descriptors a request for a
pod's member gives after its three standard ones (``tests/deploy/pod_fork.py``), before
its release's (:func:`enter_pod`)."""
MESSAGE_BYTES = 1 << 20
LEFT_CHILDREN_WAIT = 5.0
"""Seconds the zygote waits for its SIGKILLed children at its end."""

PRELOADED = (
    "cluster.cli", "cluster.members", "cluster.workers", "cluster.worker",
    "migratory.server.run", "migratory.config", "migratory.logs", "migratory.config_values",
    "cluster.node", "cluster.seed", "cluster.raft", "cluster.monitoring", "cluster.dump_downgrade",
    "cluster.agreement_probe", "cluster.raft_front_server", "encodings.idna", "encodings.latin_1",
    "cryptography.hazmat.backends.openssl.backend", "gzip",
)
"""What ``serve`` imports (lazily, in ``cluster.cli``) as a seed, a non-seed and a server
alone: found with ``python -X importtime -m cluster serve`` of each (524 modules; these
import all but 8: ``sitecustomize`` and the Windows and Jython ones that are absent).
A module left out is imported by the child, as an exec'd one would: slower, not wrong."""


def prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


def send(control: socket.socket, message: dict[str, Any], fds: list[int] = ()) -> None:  # type: ignore[assignment]
    socket.send_fds(control, [json.dumps(message).encode()], list(fds))


class Zygote:
    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.children: dict[int, int] = {}
        """pid -> the child's number (given by the test side)."""
        self.wakeup_read, self.wakeup_write = os.pipe()
        os.set_blocking(self.wakeup_read, False)
        os.set_blocking(self.wakeup_write, False)

    def serve(self) -> tuple[dict[str, Any], list[int]] | None:
        """Until EOF (None); in a forked child, returns what it is to become."""
        signal.set_wakeup_fd(self.wakeup_write)
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        while True:
            self.reap()
            ready, _, _ = select.select([self.control, self.wakeup_read], [], [])
            if self.wakeup_read in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wakeup_read, 4096)
            if self.control not in ready:
                continue
            message, fds, _, _ = socket.recv_fds(self.control, MESSAGE_BYTES, 7)
            if not message:
                self.end()
                return None
            request = json.loads(message)
            pid = os.fork()
            if pid == 0:
                return request, fds
            pidfd = os.pidfd_open(pid)
            self.children[pid] = request["number"]
            send(self.control, {"number": request["number"], "pid": pid}, [pidfd])
            for fd in (pidfd, *fds):
                os.close(fd)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            number = self.children.pop(pid, None)
            if number is not None:  # (else an orphan of a child: reaped, as by init)
                with contextlib.suppress(OSError):
                    send(self.control, {"number": number, "status": status})

    def end(self) -> None:
        for pid in self.children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        signal.signal(signal.SIGALRM, lambda _signum, _frame: None)
        signal.setitimer(signal.ITIMER_REAL, LEFT_CHILDREN_WAIT)
        with contextlib.suppress(ChildProcessError, InterruptedError):
            while self.children:
                pid, _ = os.waitpid(-1, 0)
                self.children.pop(pid, None)

    def release(self) -> None:
        """In a child: drop what the zygote's loop held."""
        signal.set_wakeup_fd(-1)
        self.control.close()
        os.close(self.wakeup_read)
        os.close(self.wakeup_write)


def enter_pod(fds: list[int]) -> None:
    """In a forked child (one thread, as ``setns(CLONE_NEWNS)`` needs), given a pod's
    descriptors: into the network, UTS and mount namespaces of the first three
    (:data:`NAMESPACES`' order), then held until the fourth (a pipe's read end) is at EOF:
    the pod released, as an exec'd pod's shell waits for it. The mount namespace's also
    sets this process's root and cwd to that namespace's root: :func:`become` then goes
    to the request's cwd in it, as the shell's ``exec`` kept its own."""
    if not fds:
        return
    *namespaces, release = fds
    libc = ctypes.CDLL(None, use_errno=True)
    for fd, kind in zip(namespaces, NAMESPACES, strict=True):
        if libc.setns(fd, kind) != 0:
            raise OSError(ctypes.get_errno(), f"setns({kind:#x})")
        os.close(fd)
    while os.read(release, 1):
        pass
    os.close(release)


def become(request: dict[str, Any], fds: list[int]) -> None:
    """In a forked child: what ``python -m cluster <args>`` (``-c CODE``, or ``python
    SCRIPT <args>`` for a pod's) would be at its start."""
    for sig, handler in START_SIGNALS.items():
        if handler is not None:
            with contextlib.suppress(OSError, ValueError):
                signal.signal(sig, handler)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            with contextlib.suppress(OSError):
                os.close(int(name))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv: list[str] = request["argv"]
    sys.orig_argv[:] = argv
    if argv[1] in ("-m", "-c"):
        sys.argv[:] = [argv[1], *argv[3:]]
        sys.path[0] = os.getcwd() if argv[1] == "-m" else ""
    else:  # a script: its directory first on the path, as CPython's start puts it
        sys.argv[:] = argv[1:]
        sys.path[0] = os.path.dirname(os.path.realpath(argv[1]))
    fresh_standard_streams()


def run(argv: list[str]) -> None:
    """``python -m MODULE`` or ``python -c CODE`` (the zygote's own tests)."""
    main = types.ModuleType("__main__")  # a fresh one, not this script's
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    if argv[1] == "-m":  # what ``python -m`` calls: sys.argv[0] and __main__ stay its
        runpy._run_module_as_main(argv[2], alter_argv=True)  # type: ignore[attr-defined]
    elif argv[1] == "-c":
        exec(compile(argv[2], "<string>", "exec"), main.__dict__)
    else:  # what ``python SCRIPT`` runs (pymain_run_file): its code in __main__
        main.__dict__.update(__file__=argv[1], __cached__=None, __loader__=(
            importlib.machinery.SourceFileLoader("__main__", argv[1])))
        with open(argv[1], "rb") as script:
            source = script.read()
        exec(compile(source, argv[1], "exec"), main.__dict__)


def fresh_standard_streams() -> None:
    """New ``sys.stdin``/``stdout``/``stderr`` on descriptors 0-2 as CPython's start-up
    makes them (``create_stdio``): buffered unless ``-u``, line-buffered on a terminal
    and always for stderr, the zygote's encoding and errors (the same locale)."""
    buffered = not sys.__stdout__.write_through  # (-u, PYTHONUNBUFFERED: the zygote's)
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        old = getattr(sys, f"__{name}__")
        raw = io.FileIO(fd, mode, closefd=False)
        raw.name = f"<{name}>"  # type: ignore[misc]
        binary: Any = raw
        if buffered or mode == "r":
            binary = (io.BufferedReader if mode == "r" else io.BufferedWriter)(raw)
        stream = io.TextIOWrapper(
            binary, encoding=old.encoding, errors=old.errors, newline="\n",
            line_buffering=buffered and (raw.isatty() or fd == 2),
            write_through=not buffered,
        )
        stream.mode = mode  # type: ignore[misc]
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def start(control_fd: int, parent: int, path0: str | None = None,
          ) -> tuple[dict[str, Any], list[int]] | None:
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the line above
        raise SystemExit("zygote: the test process is gone")
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    control = socket.socket(fileno=control_fd)
    sys.path[0] = path0 or os.getcwd()  # where ``python -m cluster`` finds its modules
    for name in PRELOADED:
        importlib.import_module(name)
    if threading.active_count() != 1:
        raise SystemExit(f"zygote: {threading.active_count()} threads after imports")
    gc.freeze()  # (its children's finalization does not copy the whole heap)
    zygote = Zygote(control)
    locale = {k: v for k, v in os.environ.items() if k.startswith(("LC_", "LANG"))}
    send(control, {"ready": os.getpid(), "locale": locale})  # (LC_CTYPE: PEP 538's)
    became = zygote.serve()
    if became is not None:
        zygote.release()
    return became


if __name__ == "__main__":
    _became = start(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:])
    if _became is None:
        sys.exit(0)
    enter_pod(_became[1][3:])  # (none but a pod's member's)
    become(_became[0], _became[1][:3])
    _argv = _became[0]["argv"]
    del _became
    run(_argv)
