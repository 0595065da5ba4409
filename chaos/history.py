"""The history writer: one JSON-lines file per table of :mod:`chaos.schema`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO

from chaos import schema


class History:
    """Writes ``OUT/history/TABLE.jsonl``; every line is a :func:`schema.record` of the run,
    timed in seconds since ``t0`` (the runner's ``time.monotonic()``)."""

    def __init__(self, out: Path, run: str, t0: float) -> None:
        (out / "history").mkdir(parents=True, exist_ok=True)
        self.run, self.t0 = run, t0
        self.files: dict[str, TextIO] = {
            t: (out / "history" / f"{t}.jsonl").open("w") for t in schema.TABLES
        }
        self.counts = {t: 0 for t in schema.TABLES}

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 6)

    def write(self, table: str, **values: Any) -> None:
        values.setdefault("time", self.now())
        line = schema.record(table, run=self.run, **values)
        self.files[table].write(json.dumps(line) + "\n")
        self.counts[table] += 1

    def flush(self) -> None:
        for f in self.files.values():
            f.flush()

    def close(self) -> None:
        for f in self.files.values():
            f.close()
