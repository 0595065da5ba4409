"""TEST-ONLY: makes one member process of a chaos run exit on its own.

Python imports ``sitecustomize`` at start-up from its path.
``tests/chaos/test_chaos_checked.py`` puts this directory on the ``PYTHONPATH`` of one
chaos run, so every process of that run imports this module. It acts only when
``CHAOS_TEST_SELF_EXIT=NAME:STATUS:TRIGGER`` is set and the process is the member started
with ``--set ServerName=NAME``: a daemon thread then waits for the file TRIGGER to appear
(the test creates it mid-run), takes it (renames it to TRIGGER.taken, so one process
fires, once), writes a line to stderr (the member's log) and ends the process with
``os._exit(STATUS)``. Nothing under ``migratory/``, ``cluster/`` or ``chaos/`` knows
about it.
"""

from __future__ import annotations

import os
import sys
import threading
import time

ENV = "CHAOS_TEST_SELF_EXIT"


def _arm(name: str, status: int, trigger: str) -> None:
    def wait_and_exit() -> None:
        while True:
            time.sleep(0.05)
            try:
                os.rename(trigger, trigger + ".taken")
            except FileNotFoundError:
                continue
            sys.stderr.write(f"TEST SELF-EXIT: {name} exits on its own with status {status}\n")
            sys.stderr.flush()
            os._exit(status)

    threading.Thread(target=wait_and_exit, name="test-self-exit", daemon=True).start()


def _main() -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, status, trigger = spec.split(":", 2)
    if f"ServerName={name}" in sys.orig_argv:
        _arm(name, int(status), trigger)


_main()
