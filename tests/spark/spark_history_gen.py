"""A synthetic, correct chaos history (and planted faults) for the spark_analysis tests.

The run it describes: a Guaranteed cluster of three seeds; publishers round-robin over
``subjects`` subjects at ``rate`` publishes/s; ``subscribers`` sdk subscribers (s0, s1, ..)
and as many raw auditors (a0, a1, ..), each subscribed from the start to
``per_subscriber`` subjects (fresh ``SUBSCRIBE_ALLOW`` at position (1, 0), as the real
cluster sends before a subject's first message); all unsubscribed at teardown, after the
last publish. In the middle, the Raft leader (migratory-0) is killed:

- publishing stops for 1 s (one publish-unavailability window); one publish in flight to
  migratory-0 ends ``info`` and is never numbered, another ends ``info`` but was numbered
  and is delivered; one publish during the outage fails;
- cluster samples show no leader for 0.5 s, then migratory-1;
- subscribers connected to migratory-0 see SERVER_DOWN, then resume on migratory-1 after
  1.2 s: the messages numbered meanwhile come as ``recovered`` before a DATA_SYNC, except
  for one sdk subscriber (the resync case) that gets the snapshot and a DATA_RESYNC
  skipping exactly what it missed;
- s1 unsubscribes from its second subject at 80 % of the run (nothing expected after).

Every table is written sorted by time (stable: the order rows were added breaks ties).
Run as a script to write a large history for timing the analysis::

    python tests/spark/spark_history_gen.py OUT_DIR --publishes 30000 --subscribers 4
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # when run as a script
    sys.path.insert(0, str(ROOT))

from chaos.schema import TABLES, record  # noqa: E402

RUN = "synthetic"
MEMBERS = ("migratory-0", "migratory-1", "migratory-2")
VICTIM = ("sdk", "s0", "/chaos/s0")  # where the planted faults go by default


def epoch_of(subject_index: int) -> int:
    return 39_625_015_223_748 + 7919 * subject_index


@dataclass
class Synthetic:
    run: dict[str, Any]
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {t: [] for t in TABLES})
    facts: dict[str, Any] = field(default_factory=dict)  # what the generator planted on purpose

    def add(self, table: str, **values: Any) -> dict[str, Any]:
        row = record(table, run=RUN, **values)
        self.tables[table].append(row)
        return row

    def deliveries_of(self, kind: str, subscriber: str, subject: str) -> list[dict[str, Any]]:
        return sorted(
            (
                d
                for d in self.tables["deliveries"]
                if (d["kind"], d["subscriber"], d["subject"]) == (kind, subscriber, subject)
                and d["type"] != "snapshot"
            ),
            key=lambda d: d["time"],
        )

    def write(self, run_dir: Path) -> Path:
        (run_dir / "history").mkdir(parents=True, exist_ok=True)
        (run_dir / "run.json").write_text(json.dumps(self.run))
        schedule = [{"at": f["time"], "fault": f["fault"], "target": f["target"]} for f in
                    self.tables["nemesis"] if f["phase"] == "start" and f["fault"] != "restart"]
        (run_dir / "schedule.jsonl").write_text("".join(json.dumps(s) + "\n" for s in schedule))
        for table, rows in self.tables.items():
            rows = sorted(rows, key=lambda r: r["time"])
            with (run_dir / "history" / f"{table}.jsonl").open("w") as fh:
                fh.writelines(json.dumps(row) + "\n" for row in rows)
        return run_dir


@dataclass
class _Sub:
    kind: str
    name: str
    member: str
    subjects: list[str]
    resync: bool = False  # resumes with DATA_RESYNC instead of DATA_SYNC


def _subscribers(n: int, names: list[str], per: int) -> list[_Sub]:
    subs = []
    for i in range(n):
        mine = [names[(i + k) % len(names)] for k in range(min(per, len(names)))]
        subs.append(_Sub("sdk", f"s{i}", MEMBERS[0] if i % 2 == 0 else MEMBERS[1], mine))
        subs.append(_Sub("raw", f"a{i}", MEMBERS[0] if i % 2 == 1 else MEMBERS[2], mine))
    resyncers = [s for s in subs if s.kind == "sdk" and s.member == MEMBERS[0] and s.name != "s0"]
    if resyncers:
        resyncers[-1].resync = True
    return subs


def _cluster(syn: Synthetic, duration: float, kill_at: float, restart_at: float) -> None:
    t = 0.0
    while t < duration:
        leader = MEMBERS[0] if t < kill_at else None if t < kill_at + 0.5 else MEMBERS[1]
        for m in MEMBERS:
            down = m == MEMBERS[0] and kill_at <= t < restart_at
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
    for time, fault, phase, detail in (
        (kill_at, "kill", "start", "leader"),
        (kill_at + 0.05, "kill", "end", "leader"),
        (restart_at, "restart", "start", "pid 4242"),
        (restart_at + 0.5, "restart", "end", "ready"),
    ):
        syn.add("nemesis", time=time, fault=fault, target=MEMBERS[0], phase=phase, detail=detail)


def generate(
    publishes: int = 600,
    subjects: int = 3,
    subscribers: int = 3,
    rate: float = 100.0,
    seed: int = 1,
    per_subscriber: int = 2,
) -> Synthetic:
    """``publishes`` acked publishes at ``rate``/s; ``subscribers`` per kind."""
    rnd = random.Random(seed)
    names = [f"/chaos/s{i}" for i in range(subjects)]
    epochs = {s: epoch_of(i) for i, s in enumerate(names)}
    kill_at = 1.0 + (publishes // 2) / rate
    pause_end, down_at, resume_at = kill_at + 1.0, kill_at + 0.01, kill_at + 1.2
    duration = publishes / rate + 4.0
    unsub_at = 1.0 + 0.8 * publishes / rate
    syn = Synthetic(
        run={"run": RUN, "seed": seed, "duration": duration, "mode": "Guaranteed", "seeds": 3}
    )
    _cluster(syn, duration, kill_at, kill_at + 4.0)
    subs = _subscribers(subscribers, names, per_subscriber)
    for i, s in enumerate(subs):
        for subject in s.subjects:
            syn.add("subscriptions", subscriber=s.name, kind=s.kind, subject=subject,
                    event="subscribed", time=0.1 + i * 1e-3)
            syn.add("subscriptions", subscriber=s.name, kind=s.kind, subject=subject,
                    event="SUBSCRIBE_ALLOW", member=s.member, epoch=1, seq=0,
                    time=0.12 + i * 1e-3)
    gone = (subs[2], subs[2].subjects[-1]) if len(subs) > 2 else None  # s1's last subject
    if gone:
        syn.add("subscriptions", subscriber=gone[0].name, kind="sdk", subject=gone[1],
                event="unsubscribed", time=unsub_at)
    seqs = dict.fromkeys(names, 0)
    at_resume = dict.fromkeys(names, 0)  # last seq numbered before the resume
    held: dict[tuple[str, str], list[tuple[int, str]]] = {}  # (subscriber, subject) -> msgs

    def number(msg: str, subject: str, t: float) -> int:
        seqs[subject] += 1
        if t < resume_at:
            at_resume[subject] = seqs[subject]
        for s in subs:
            if subject not in s.subjects or (gone and (s, subject) == gone and t >= unsub_at):
                continue
            at = t + 0.003 + rnd.random() * 0.004
            if s.member == MEMBERS[0] and at >= down_at and t < resume_at:
                held.setdefault((s.name, subject), []).append((seqs[subject], msg))
                continue
            syn.add("deliveries", subscriber=s.name, kind=s.kind,
                    member=MEMBERS[1] if s.member == MEMBERS[0] and at >= down_at else s.member,
                    subject=subject, epoch=epochs[subject], seq=seqs[subject], msg_id=msg,
                    type="update", time=at)
        return seqs[subject]

    def publish(pub: str, msg: str, subject: str, member: str, t: float) -> None:
        syn.add("publishes", publisher=pub, type="invoke", msg_id=msg, subject=subject,
                member=member, time=t)

    t, n = 1.0, 0
    in_flight: tuple[str, str] | None = None  # (msg_id, subject)
    while n < publishes:
        if kill_at <= t < pause_end:  # the outage: one failure, then silence
            publish("p0", "p0-fail", names[0], MEMBERS[0], kill_at + 0.2)
            syn.add("publishes", publisher="p0", type="fail", msg_id="p0-fail", subject=names[0],
                    member=MEMBERS[0], time=kill_at + 0.21, reason="connection refused")
            t = pause_end
            if in_flight:  # numbered by the new leader, its ack lost with the old one
                number(*in_flight, t - 1e-3)
            continue
        subject, pub = names[n % subjects], f"p{n % 4}"
        msg = f"{pub}-{n}"
        member = MEMBERS[1 + n % 2]
        publish(pub, msg, subject, member, t)
        seq = number(msg, subject, t)
        syn.add("publishes", publisher=pub, type="ok", msg_id=msg, subject=subject,
                member=member, time=t + 0.002, epoch=epochs[subject], seq=seq)
        flight = in_flight is None and t + 1.0 / rate >= kill_at  # the last one before
        if n % 97 == 50 or flight:
            ghost = f"{pub}-u{n}"  # outcome unknown; never numbered unless in flight
            publish(pub, ghost, subject, MEMBERS[0], t + 1e-3)
            syn.add("publishes", publisher=pub, type="info", msg_id=ghost, subject=subject,
                    member=MEMBERS[0], time=t + 0.5, reason="timeout")
            if flight:
                in_flight = (ghost, subject)
                syn.facts["info_delivered"] = ghost
        t += 1.0 / rate
        n += 1
    _resume(syn, subs, held, at_resume, epochs, down_at, resume_at)
    for s in subs:
        for subject in s.subjects:
            if not (gone and (s, subject) == gone):
                syn.add("subscriptions", subscriber=s.name, kind=s.kind, subject=subject,
                        event="unsubscribed", time=duration + 1.0)
    return syn


def _resume(syn: Synthetic, subs: list[_Sub], held: dict[tuple[str, str], list[tuple[int, str]]],
            last: dict[str, int], epochs: dict[str, int], down_at: float,
            resume_at: float) -> None:
    for s in (s for s in subs if s.member == MEMBERS[0]):
        syn.add("subscriptions", subscriber=s.name, kind=s.kind, event="SERVER_DOWN",
                member=MEMBERS[0], time=down_at)
        syn.add("subscriptions", subscriber=s.name, kind=s.kind, event="SERVER_UP",
                member=MEMBERS[1], time=resume_at - 1e-3)
        for subject in s.subjects:
            missed = sorted(held.get((s.name, subject), []))
            pos = last[subject]
            syn.add("subscriptions", subscriber=s.name, kind=s.kind, subject=subject,
                    event="SUBSCRIBE_ALLOW", member=MEMBERS[1], time=resume_at - 5e-4)
            at = resume_at
            if s.resync:
                snap = next(m for q, m in missed if q == pos) if missed else None
                if snap:
                    syn.add("deliveries", subscriber=s.name, kind=s.kind, member=MEMBERS[1],
                            subject=subject, epoch=epochs[subject], seq=pos, msg_id=snap,
                            type="snapshot", time=at)
                    syn.facts.setdefault("resync_skipped", []).extend(
                        (s.name, subject, q) for q, _ in missed)
            else:
                for q, m in missed:
                    syn.add("deliveries", subscriber=s.name, kind=s.kind, member=MEMBERS[1],
                            subject=subject, epoch=epochs[subject], seq=q, msg_id=m,
                            type="recovered", time=at)
                    at += 1e-6
            syn.add("subscriptions", subscriber=s.name, kind=s.kind, subject=subject,
                    event="DATA_RESYNC" if s.resync else "DATA_SYNC", member=MEMBERS[1],
                    epoch=epochs[subject], seq=pos, time=at + 1e-5)


# ---- planted faults, on (kind, subscriber, subject) = VICTIM unless told otherwise ----


def _victim(syn: Synthetic, who: tuple[str, str, str] = VICTIM) -> list[dict[str, Any]]:
    return syn.deliveries_of(*who)


def plant_lost(syn: Synthetic, who: tuple[str, str, str] = VICTIM) -> None:
    ds = _victim(syn, who)
    syn.tables["deliveries"].remove(ds[len(ds) // 3])


def plant_lost_raw(syn: Synthetic) -> None:
    plant_lost(syn, ("raw", "a0", "/chaos/s0"))


def plant_duplicate(syn: Synthetic) -> None:
    d = _victim(syn)[len(_victim(syn)) // 3]
    syn.tables["deliveries"].append(dict(d, time=d["time"] + 1e-5))


def plant_reorder(syn: Synthetic) -> None:
    ds = _victim(syn)
    a, b = ds[len(ds) // 3], ds[len(ds) // 3 + 1]
    for key in ("seq", "msg_id"):
        a[key], b[key] = b[key], a[key]


def plant_unexpected(syn: Synthetic) -> None:
    kind, who, subject = VICTIM
    syn.add("deliveries", subscriber=who, kind=kind, member=MEMBERS[1], subject=subject,
            epoch=12345, seq=1, msg_id="nobody-1", type="update",
            time=_victim(syn)[-1]["time"] + 0.1)


def plant_collision(syn: Synthetic) -> None:
    """A second msg_id acknowledged at an existing position and delivered there."""
    orig = _victim(syn)[len(_victim(syn)) // 3]
    inv = next(p for p in syn.tables["publishes"] if p["msg_id"] == orig["msg_id"])
    msg, subject = "p9-collides", orig["subject"]
    syn.add("publishes", publisher="p9", type="invoke", msg_id=msg, subject=subject,
            member=MEMBERS[1], time=inv["time"])
    syn.add("publishes", publisher="p9", type="ok", msg_id=msg, subject=subject,
            member=MEMBERS[1], time=inv["time"] + 0.002, epoch=orig["epoch"], seq=orig["seq"])
    rows = syn.tables["deliveries"]
    for d in [d for d in rows if d["msg_id"] == orig["msg_id"]]:
        rows.append(dict(d, msg_id=msg, time=d["time"] + 1e-5))


def _resync_over(syn: Synthetic, ds: list[dict[str, Any]], i: int) -> None:
    """Drop delivery ``i`` and announce it with a DATA_RESYNC at its position."""
    kind, who, subject = VICTIM
    gone, nxt = ds[i], ds[i + 1]
    syn.tables["deliveries"].remove(gone)
    syn.add("subscriptions", subscriber=who, kind=kind, subject=subject, event="DATA_RESYNC",
            member=MEMBERS[1], epoch=gone["epoch"], seq=gone["seq"],
            time=(gone["time"] + nxt["time"]) / 2)


def plant_resync_gap(syn: Synthetic) -> None:
    """A dropped delivery covered by a DATA_RESYNC: not a violation."""
    ds = _victim(syn)
    _resync_over(syn, ds, len(ds) // 3)


def plant_resync_twice(syn: Synthetic) -> None:
    """Two deliveries in a row dropped, each announced by its own DATA_RESYNC, nothing
    delivered between the two (a subscriber failing over twice off the cache): the two
    resyncs together cover the hole, so not a violation."""
    ds = _victim(syn)
    i = len(ds) // 3
    kind, who, subject = VICTIM
    first, second, nxt = ds[i], ds[i + 1], ds[i + 2]
    for gone in (first, second):
        syn.tables["deliveries"].remove(gone)
    t = (first["time"] + nxt["time"]) / 2
    for gone, when in ((first, t), (second, t + 1e-4)):
        syn.add("subscriptions", subscriber=who, kind=kind, subject=subject,
                event="DATA_RESYNC", member=MEMBERS[1], epoch=gone["epoch"], seq=gone["seq"],
                time=when)


def plant_resync_elsewhere(syn: Synthetic) -> None:
    """A dropped delivery, and a later DATA_RESYNC that skips only another seq: the
    resync explains its own gap, not the earlier one (one lost, one hole)."""
    ds = _victim(syn)
    syn.tables["deliveries"].remove(ds[len(ds) // 3])
    _resync_over(syn, ds, len(ds) // 3 + 5)


def plant_resync_unnumbered(syn: Synthetic) -> None:
    """The first message of a subject never delivered, then a DATA_RESYNC without a
    position while the subscriber is still at (1, 0), where it subscribed before the
    subject was numbered (the message expired and the subject was forgotten before the
    resume): announced, so not a violation."""
    kind, who, subject = VICTIM
    first, second = _victim(syn)[:2]
    syn.tables["deliveries"].remove(first)
    syn.add("subscriptions", subscriber=who, kind=kind, subject=subject, event="DATA_RESYNC",
            member=MEMBERS[1], time=(first["time"] + second["time"]) / 2)


# ---- an mqtt subscriber (persistent MQTT session), added by its plants only ----

def plant_crash(syn: Synthetic) -> None:
    """A member that exited on its own in the middle of the run (a ``crashes`` row)."""
    middle = syn.tables["publishes"][len(syn.tables["publishes"]) // 2]["time"]
    syn.add("crashes", member=MEMBERS[2], pid=4343, exit_status=1, time=middle,
            log_tail="INFO replicating\nTraceback (most recent call last):\n"
                     "ValueError: sync at clsn 13110 is older than applied 14048")
    syn.facts["crash_time"] = middle


def in_namespace(syn: Synthetic, tag: str) -> Synthetic:
    """``syn`` with its subjects, subscribers, publishers and msg_ids renamed into their own
    namespace ``tag`` (``/chaos/s0`` -> ``/tag/chaos/s0``, ``s0`` -> ``tag:s0``), so that
    several histories can be checked in one run without touching each other."""
    for table in ("publishes", "deliveries", "subscriptions"):
        for row in syn.tables[table]:
            if row.get("subject") is not None:
                row["subject"] = f"/{tag}{row['subject']}"
            for key in ("subscriber", "publisher", "msg_id"):
                if row.get(key) is not None:
                    row[key] = f"{tag}:{row[key]}"
    return syn


def merged(histories: list[Synthetic]) -> Synthetic:
    """One run holding the clients' tables of every history (each in its own namespace:
    :func:`in_namespace`); the run, its cluster samples, faults and crashes are the first's
    (the same for histories generated with the same arguments)."""
    first, *rest = histories
    for syn in rest:
        for table in ("publishes", "deliveries", "subscriptions"):
            first.tables[table].extend(syn.tables[table])
    return first


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="write a synthetic chaos history")
    parser.add_argument("out", type=Path)
    parser.add_argument("--publishes", type=int, default=30_000)
    parser.add_argument("--subjects", type=int, default=4)
    parser.add_argument("--subscribers", type=int, default=4, help="per kind (sdk, raw)")
    parser.add_argument("--per-subscriber", type=int, default=4, help="subjects each")
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    syn = generate(args.publishes, args.subjects, args.subscribers, args.rate, args.seed,
                   args.per_subscriber)
    syn.write(args.out)
    print({t: len(rows) for t, rows in syn.tables.items()})


if __name__ == "__main__":
    main()
