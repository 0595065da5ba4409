"""A chaos workload that never connects (its members' URLs lead nowhere), for tests
that feed its recorders bytes and read the history rows they write."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from chaos.history import History
from chaos.plan import plan_workload
from chaos.workload import Workload


def offline_workload(tmp_path: Path, **subscribers: int) -> Workload:
    """Three members, four subjects, one SDK subscriber, one auditor and ``subscribers``
    (e.g. ``mqtt_subscribers=1``), two subjects each."""
    plan = plan_workload(3, members=3, subjects=4, sdk_subscribers=1, auditors=1,
                         per_subscriber=2, **subscribers)
    h = History(tmp_path, "r", time.monotonic())
    return Workload(seed=3, plan=plan, client_urls=["ws://127.0.0.1:1"] * 3, history=h,
                    say=lambda text: None)


def history_rows(w: Workload, table: str) -> list[dict[str, Any]]:
    """The rows written so far to ``table``."""
    w.h.flush()
    lines = Path(w.h.files[table].name).read_text().splitlines()
    return [json.loads(line) for line in lines]
