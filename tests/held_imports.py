"""A command held in the middle of its start-up imports, for a test to signal it there.

A ``sitecustomize`` on the command's PYTHONPATH stops the import of one module: it says
``importing NAME`` on stderr and waits on its stdin, which the test never writes. The
test reads that line, then sends its signal: the signal comes in that import, every
time, with no sleep to guess it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

HOLD_IMPORT = '''
import importlib.abc, os, sys

class HoldImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == os.environ["HOLD_IMPORT_OF"]:
            sys.meta_path.remove(self)
            os.write(2, f"importing {name}\\n".encode())
            sys.stdin.buffer.read(1)  # never written: until a signal ends it
        return None

sys.meta_path.insert(0, HoldImport())
'''


def ignoring_sigint() -> None:
    """A child's SIGINT as a background job of a script has it (``tool &``): ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def as_from_a_terminal() -> None:
    """A child's SIGINT as a terminal's foreground job has it (default), whatever the
    test runner's: ``make test`` in a background job (``nohup make test &``) starts
    every child with SIGINT ignored, and a command that keeps it ignored -- as it
    should -- then never saw the test's Ctrl-C (CI failed so)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_held_at(
    tmp_path: Path, module: str, args: Sequence[str], *, sigint_ignored: bool = False
) -> subprocess.Popen[bytes]:
    """``args`` started with the import of ``module`` held (read the line it writes), as
    a terminal's foreground job (or a background job's, ``sigint_ignored``); one byte
    written to its stdin lets the import go on."""
    (tmp_path / "sitecustomize.py").write_text(HOLD_IMPORT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIGRATORY_CFG_")}
    root = Path(__file__).resolve().parents[1]  # (python -m chaos / spark_analysis)
    env.update(PYTHONPATH=f"{tmp_path}{os.pathsep}{root}", HOLD_IMPORT_OF=module)
    return subprocess.Popen(list(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=tmp_path,
                            preexec_fn=ignoring_sigint if sigint_ignored else as_from_a_terminal)
