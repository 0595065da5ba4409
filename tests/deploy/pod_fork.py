"""A pod's member forked from a zygote (``tests/zygote.py``) in the pod's namespaces.

An exec'd pod's member spent ~1 CPU-s starting (its interpreter, ~530 modules from the
bytecode cache), and a play starts 3-5 pods several times. A :class:`PodZygotes` keeps,
for the pods of a play, a zygote started as their interpreter would start (the command's
interpreter, the pod's environment as far as the interpreter reads it at its start,
``sys.path[0]`` the command's directory). The pod's sandbox (``pod_sandbox.py``) then
keeps a holder process that owns the pod's network, UTS and mount namespaces, set up by
the same shell lines as an exec'd pod's; the member is forked from the zygote, enters
them (``setns``), waits for the pod's release as the exec'd pod's shell did, goes to the
cwd and becomes the command (``zygote.enter_pod``, ``zygote.become``), with what the
exec'd one had beside the pod's environment: its shell's ``PWD``, the interpreter's
``LC_CTYPE`` (PEP 538: the manifest names no locale). ``tests/deploy/test_pod_fork.py``
compares the two. What still differs, beside what ``tests/zygote.py`` lists (one hash
seed for the pods of a play, ``/proc/PID/cmdline``): the member's parent is the zygote
(the exec'd one's was the play; no member reads it); the command is found on the pod's
PATH from outside the pod (the pod's mounts cover none of its directories:
``PodProcess`` refuses an emptyDir over the venv); a setup command that fails raises in
the play (an exec'd pod exited with its status: no play sets one to fail).
``MIGRATORY_TESTS_EXEC=1`` execs every pod, as every member (``tests/zygote_process.py``);
so does a command that is not a Python interpreter's (``sh -c``) or a script of another
interpreter than the one the tests run.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))  # (the tests' zygote)

from zygote_process import EXEC_ENV, ForkedProcess, Zygote, read_at_start

STARTS_WITH = ("PATH", "HOME")
"""What else of a pod's environment the interpreter reads at its start (``sys.executable``
of a bare name, the user's site directory): the zygote gets it too."""


def interpreter(command: list[str], path: str) -> tuple[str, list[str]] | None:
    """The interpreter that runs ``command`` and the arguments its process is started
    with (``sys.orig_argv``: as the pod's shell gives them), if that is the interpreter
    of the tests (resolved alike: a venv's ``python`` and ``python3`` are two names of
    one binary, whose ``sys.executable`` is the name); else None."""
    found = shutil.which(command[0], path=path)
    if found is None:
        return None
    ours = os.path.realpath(sys.executable)
    if os.path.realpath(found) == ours:  # ``python -c``/``-m``, named by PATH
        if len(command) < 3 or command[1] not in ("-c", "-m"):
            return None
        return found, command
    with open(found, "rb") as script:
        first = script.readline(4096).decode(errors="replace").strip()
    if not first.startswith("#!") or " " in first[2:].strip():
        return None
    python = first[2:].strip()
    if os.path.realpath(python) != ours:
        return None
    return python, [python, found, *command[1:]]


class PodZygotes:
    """The zygotes of one play's pods: one per interpreter and start-time environment."""

    def __init__(self) -> None:
        self._zygotes: dict[tuple[str, tuple[tuple[str, str], ...]], Zygote] = {}
        self._lock = threading.Lock()  # (pods are made in threads, at once)

    @staticmethod
    def enabled() -> bool:
        return os.environ.get(EXEC_ENV) != "1"

    def forks(self, command: list[str], env: dict[str, str]) -> bool:
        """Whether :meth:`start` forks ``command`` (else the pod must exec it)."""
        return self.enabled() and interpreter(command, env.get("PATH", os.defpath)) is not None

    def start(self, command: list[str], env: dict[str, str], fds: list[int],
              namespaces: list[int]) -> ForkedProcess:
        """``command`` forked in the ``namespaces`` (net, uts, mnt descriptors) with
        ``env`` and ``fds`` (stdin, stdout, stderr), where :meth:`forks` said so."""
        found = interpreter(command, env.get("PATH", os.defpath))
        assert found is not None, command
        python, argv = found
        starts = {k: v for k, v in env.items() if k in STARTS_WITH} | read_at_start(env)
        key = (python, tuple(sorted(starts.items())))
        with self._lock:
            zygote = self._zygotes.get(key)
            if zygote is None or zygote.gone:  # (started from zygote_process._STARTER)
                zygote = self._zygotes[key] = Zygote(python, starts, os.path.dirname(argv[1]))
        added = {k: v for k, v in zygote.locale.items() if k not in starts}
        # what the exec'd pod's process had beside ``env``: the pod's shell's PWD, the
        # interpreter's locale coercion (LC_CTYPE, without a locale in the manifest)
        full = {"PWD": zygote.cwd, **env, **added}
        return ForkedProcess(zygote, argv, full, [*fds, *namespaces], None)

    def close(self) -> None:
        """Each zygote ended and waited for (its children's CPU then this process's)."""
        with self._lock:
            for zygote in self._zygotes.values():
                zygote.close()
            self._zygotes.clear()
