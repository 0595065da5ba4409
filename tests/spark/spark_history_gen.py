"""A synthetic, correct chaos history (and planted faults) for the spark_analysis tests.

One Guaranteed cluster of three members, publishers on ``subjects`` subjects, sdk and
raw subscribers each on two subjects from the start, one leader kill in the middle
(publishes pause, subscribers see SERVER_DOWN then DATA_SYNC with recovered messages),
a few unknown-outcome publishes. Every table is written sorted by time.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # chaos/ and spark_analysis/ are not installed packages
    sys.path.insert(0, str(ROOT))

from chaos.schema import TABLES, record  # noqa: E402

RUN = "synthetic"
EPOCH = 7


@dataclass
class Synthetic:
    run: dict[str, Any]
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {t: [] for t in TABLES})

    def add(self, table: str, **values: Any) -> dict[str, Any]:
        row = record(table, run=RUN, **values)
        self.tables[table].append(row)
        return row

    def deliveries_of(self, subscriber: str, subject: str) -> list[dict[str, Any]]:
        return [
            d
            for d in self.tables["deliveries"]
            if d["subscriber"] == subscriber and d["subject"] == subject and d["type"] != "snapshot"
        ]

    def write(self, run_dir: Path) -> Path:
        (run_dir / "history").mkdir(parents=True, exist_ok=True)
        (run_dir / "run.json").write_text(json.dumps(self.run))
        for table, rows in self.tables.items():
            rows = sorted(rows, key=lambda r: r["time"])  # stable: planted order kept on ties
            with (run_dir / "history" / f"{table}.jsonl").open("w") as fh:
                for row in rows:
                    fh.write(json.dumps(row) + "\n")
        return run_dir


def generate(
    publishes: int = 600,
    subjects: int = 3,
    subscribers: int = 3,
    rate: float = 100.0,
    seed: int = 1,
) -> Synthetic:
    """``publishes`` acked publishes at ``rate``/s; ``subscribers`` per kind."""
    rnd = random.Random(seed)
    duration = publishes / rate + 4.0
    syn = Synthetic(run={"seed": seed, "duration": duration, "members": 3, "faults": True})
    names = [f"/Chaos/S{i}" for i in range(subjects)]
    members = ["migratory-0", "migratory-1", "migratory-2"]
    subs: dict[str, list[tuple[str, str]]] = {n: [] for n in names}
    for kind, prefix in (("sdk", "s"), ("raw", "r")):
        for i in range(subscribers):
            who = f"{prefix}{i}"
            for subject in (names[i % subjects], names[(i + 1) % subjects]):
                if (kind, who) in subs[subject]:
                    continue
                subs[subject].append((kind, who))
                syn.add(
                    "subscriptions",
                    subscriber=who,
                    kind=kind,
                    subject=subject,
                    event="subscribed",
                    member=members[i % 3],
                    time=0.1 + i * 0.001,
                )
                syn.add(
                    "subscriptions",
                    subscriber=who,
                    kind=kind,
                    subject=subject,
                    event="SUBSCRIBE_ALLOW",
                    member=members[i % 3],
                    epoch=EPOCH,
                    seq=0,
                    time=0.12 + i * 0.001,
                )
    # The leader kill: publishes stop for 1.5 s, subscribers recover what they missed.
    kill_at = 1.0 + (publishes // 2) / rate
    outage = (kill_at, kill_at + 1.5)
    syn.add(
        "nemesis", time=kill_at, fault="kill", target="migratory-0", phase="start", detail="leader"
    )
    syn.add(
        "nemesis",
        time=kill_at + 5.0,
        fault="restart",
        target="migratory-0",
        phase="start",
        detail=None,
    )
    t = 0.0
    while t < duration:
        for m in members:
            down = m == "migratory-0" and kill_at <= t < kill_at + 5.0
            leader = "migratory-0" if t < kill_at else "migratory-1"
            if t >= kill_at and t < kill_at + 1.2:
                leader = None
            syn.add(
                "cluster",
                time=round(t, 3),
                member=m,
                up=not down,
                role="seed",
                raft_state=None if down else ("leader" if m == leader else "follower"),
                raft_leader=leader,
                ready=not down,
                applied_clsn=int(t * 10),
            )
        t += 0.25
    seqs = dict.fromkeys(names, 0)
    t = 1.0
    for n in range(publishes):
        if outage[0] <= t < outage[1]:
            t = outage[1]
        subject = names[n % subjects]
        pub = f"p{n % 4}"
        msg = f"{pub}-{n}"
        syn.add(
            "publishes",
            publisher=pub,
            type="invoke",
            msg_id=msg,
            subject=subject,
            member=members[1 + n % 2],
            time=t,
        )
        seqs[subject] += 1
        seq = seqs[subject]
        syn.add(
            "publishes",
            publisher=pub,
            type="ok",
            msg_id=msg,
            subject=subject,
            member=members[1 + n % 2],
            time=t + 0.002,
            epoch=EPOCH,
            seq=seq,
        )
        for kind, who in subs[subject]:
            at = t + 0.003 + rnd.random() * 0.004
            typ = "update"
            if kind == "sdk" and outage[0] + 0.2 <= at < outage[1] + 0.5:
                at, typ = outage[1] + 0.5, "recovered"  # held back, recovered on resume
            syn.add(
                "deliveries",
                subscriber=who,
                kind=kind,
                member=members[1],
                subject=subject,
                epoch=EPOCH,
                seq=seq,
                msg_id=msg,
                type=typ,
                time=at,
            )
        if n % 97 == 50:  # an unknown outcome, never numbered
            ghost = f"{pub}-u{n}"
            syn.add(
                "publishes",
                publisher=pub,
                type="invoke",
                msg_id=ghost,
                subject=subject,
                member=members[2],
                time=t + 0.001,
            )
            syn.add(
                "publishes",
                publisher=pub,
                type="info",
                msg_id=ghost,
                subject=subject,
                member=members[2],
                time=t + 0.5,
                reason="timeout",
            )
        t += 1.0 / rate
    for subject, who_list in subs.items():
        for kind, who in who_list:
            if kind != "sdk":
                continue
            syn.add(
                "subscriptions",
                subscriber=who,
                kind=kind,
                subject=None,
                event="SERVER_DOWN",
                member=members[0],
                time=outage[0] + 0.2,
            )
            syn.add(
                "subscriptions",
                subscriber=who,
                kind=kind,
                subject=subject,
                event="DATA_SYNC",
                member=members[1],
                epoch=EPOCH,
                seq=seqs[subject],
                time=outage[1] + 0.5 + 1e-4,
            )
    return syn


# ---- planted faults: each returns the (kind, subscriber, subject) it touched ----


def _victim(syn: Synthetic) -> tuple[str, str, list[dict[str, Any]]]:
    subject = "/Chaos/S0"
    return "s0", subject, syn.deliveries_of("s0", subject)


def plant_lost(syn: Synthetic) -> None:
    _, _, ds = _victim(syn)
    syn.tables["deliveries"].remove(ds[len(ds) // 3])


def plant_duplicate(syn: Synthetic) -> None:
    _, _, ds = _victim(syn)
    d = ds[len(ds) // 3]
    rows = syn.tables["deliveries"]
    rows.insert(rows.index(d) + 1, dict(d, time=d["time"] + 1e-5))


def plant_reorder(syn: Synthetic) -> None:
    _, _, ds = _victim(syn)
    a, b = ds[len(ds) // 3], ds[len(ds) // 3 + 1]
    for key in ("seq", "msg_id"):
        a[key], b[key] = b[key], a[key]


def plant_unexpected(syn: Synthetic) -> None:
    who, subject, ds = _victim(syn)
    syn.add(
        "deliveries",
        subscriber=who,
        kind="sdk",
        member="migratory-1",
        subject=subject,
        epoch=EPOCH + 1000,
        seq=1,
        msg_id="nobody-1",
        type="update",
        time=ds[-1]["time"] + 0.1,
    )


def plant_collision(syn: Synthetic) -> None:
    _, subject, ds = _victim(syn)
    orig = ds[len(ds) // 3]
    inv = next(p for p in syn.tables["publishes"] if p["msg_id"] == orig["msg_id"])
    msg = "p9-collides"
    syn.add(
        "publishes",
        publisher="p9",
        type="invoke",
        msg_id=msg,
        subject=subject,
        member="migratory-1",
        time=inv["time"],
    )
    syn.add(
        "publishes",
        publisher="p9",
        type="ok",
        msg_id=msg,
        subject=subject,
        member="migratory-1",
        time=inv["time"] + 0.002,
        epoch=orig["epoch"],
        seq=orig["seq"],
    )
    rows = syn.tables["deliveries"]
    for d in [d for d in rows if d["msg_id"] == orig["msg_id"]]:
        rows.append(dict(d, msg_id=msg, time=d["time"] + 1e-5))


def plant_resync_gap(syn: Synthetic) -> None:
    """A dropped delivery covered by a DATA_RESYNC: not a violation."""
    who, subject, ds = _victim(syn)
    i = len(ds) // 3
    gone, nxt = ds[i], ds[i + 1]
    syn.tables["deliveries"].remove(gone)
    syn.add(
        "subscriptions",
        subscriber=who,
        kind="sdk",
        subject=subject,
        event="DATA_RESYNC",
        member="migratory-1",
        epoch=EPOCH,
        seq=gone["seq"],
        time=(gone["time"] + nxt["time"]) / 2,
    )
