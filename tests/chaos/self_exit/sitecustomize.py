"""TEST-ONLY: makes one member process of a chaos run exit on its own.

Python imports ``sitecustomize`` at start-up from its path. ``tests/chaos/test_chaos_checked.py``
puts this directory on the ``PYTHONPATH`` of one chaos run, so every process of that run
imports this module; it acts only when ``CHAOS_TEST_SELF_EXIT=NAME:SECONDS:STATUS:MARKER``
is set and the process is the member started with ``--set ServerName=NAME``. Then, SECONDS
after start, the process writes a line to stderr (its log) and ends with ``os._exit(STATUS)``,
unless the file MARKER exists; it creates MARKER when it fires, so it fires once per run.
Nothing under ``migratory/``, ``cluster/`` or ``chaos/`` knows about it.
"""

from __future__ import annotations

import os
import sys
import threading
import time

ENV = "CHAOS_TEST_SELF_EXIT"


def _arm(name: str, seconds: float, status: int, marker: str) -> None:
    def fire() -> None:
        time.sleep(seconds)
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        sys.stderr.write(f"TEST SELF-EXIT: {name} exits on its own with status {status}\n")
        sys.stderr.flush()
        os._exit(status)

    threading.Thread(target=fire, name="test-self-exit", daemon=True).start()


def _main() -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, seconds, status, marker = spec.split(":", 3)
    if f"ServerName={name}" in sys.orig_argv and not os.path.exists(marker):
        _arm(name, float(seconds), int(status), marker)


_main()
