"""``python -m migratory.bench``: ``migratory bench`` (migratory/bench/cli.py)."""

import sys

from migratory import interrupted

interrupted.exit_on_sigint("migratory bench")  # (before the imports below)

from migratory.bench.cli import main  # noqa: E402

sys.exit(interrupted.run("migratory bench", main))
