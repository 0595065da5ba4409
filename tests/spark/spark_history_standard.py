"""A synthetic, correct history of a Standard cluster (and planted faults) for the
spark_analysis tests (spark_analysis/standard.py says the rules).

Three members, each numbering every message it publishes -- its publisher's and its
peers' forwards -- in its own epoch of the subject ``/chaos/s0``: migratory-0 (epoch
1000, publisher p0, subscriber s0), migratory-1 (2000, publisher p1, subscriber s1),
migratory-2 (3000, auditor a0). p0 and p1 publish in turn; each message is numbered by
its publisher's member (the ack's position), then 4 ms later by each peer its forward
reaches. What Standard does and the checker must let pass, each in it once:

- a forward gap announced: the forward of ``gap`` (p0's) never reaches migratory-2,
  which resyncs at p0's next forward (a new epoch, 3001: ``DATA_RESYNC`` to a0);
- the sender dies with a forward: ``dead`` (p1's) is acknowledged, then migratory-1 is
  killed before forwarding it; its subscriber s1 did not get it either;
- a failover: s1 resumes on migratory-2 (its snapshot and ``DATA_RESYNC``);
- a message in two lineages: ``late`` (p1's, delivered to s1 on migratory-1) reaches
  migratory-2 after s1 resumed there, so s1 gets it again, in migratory-2's epoch.
"""

from __future__ import annotations

from typing import Any

import spark_history_gen as gen

MEMBERS = gen.MEMBERS
SUBJECT = "/chaos/s0"
EPOCH = {MEMBERS[0]: 1000, MEMBERS[1]: 2000, MEMBERS[2]: 3000}
RESYNCED = 3001  # migratory-2's epoch after the forward gap
PUBLISHES = 200
GAP, NEXT_OF_P0, LATE, DEAD = 60, 62, 119, 121
FORWARD, DELIVERY = 0.004, 0.001


def _t(i: int) -> float:
    return 1.0 + i * 0.01


KILL = _t(DEAD) + 0.003  # after its ack (+ 2 ms)
RESUME = KILL + 0.5  # s1 on migratory-2
LATE_AT = RESUME + 0.1  # the late forward reaches migratory-2


def _where(subscriber: str, t: float) -> str | None:
    if subscriber == "s0":
        return MEMBERS[0]
    if subscriber == "a0":
        return MEMBERS[2]
    return MEMBERS[1] if t < KILL else MEMBERS[2] if t >= RESUME else None


def generate() -> gen.Synthetic:
    end = _t(PUBLISHES) + 1.0
    syn = gen.Synthetic(run={"run": gen.RUN, "seed": 1, "duration": end, "mode": "Standard",
                             "seeds": 3})
    subs = {"s0": "sdk", "s1": "sdk", "a0": "raw"}
    for i, (name, kind) in enumerate(subs.items()):
        syn.add("subscriptions", subscriber=name, kind=kind, subject=SUBJECT,
                event="subscribed", time=0.1 + i * 1e-3)
        where = _where(name, 0.0)
        syn.add("subscriptions", subscriber=name, kind=kind, subject=SUBJECT,
                event="SUBSCRIBE_ALLOW", member=where, epoch=EPOCH[str(where)], seq=0,
                time=0.12 + i * 1e-3)
    arrivals: list[tuple[float, str, str, int]] = []  # (time, member, msg_id, i)
    for i in range(PUBLISHES):
        t, origin = _t(i), MEMBERS[0] if i % 2 == 0 or _t(i) > KILL else MEMBERS[1]
        pub = "p0" if origin == MEMBERS[0] else "p1"
        msg = f"{pub}-{i}"
        syn.add("publishes", publisher=pub, type="invoke", msg_id=msg, subject=SUBJECT,
                member=origin, time=t, qos="standard")
        for m in MEMBERS:
            if m == MEMBERS[1] and t > KILL:
                continue
            at = t if m == origin else t + FORWARD
            if m != origin and (i == DEAD or (i == GAP and m == MEMBERS[2])):
                continue  # never forwarded
            if i == LATE and m == MEMBERS[2]:
                at = LATE_AT
            arrivals.append((at, m, msg, i))
    seqs = {m: 0 for m in MEMBERS}
    epochs = dict(EPOCH)
    for at, m, msg, i in sorted(arrivals):
        if m == MEMBERS[2] and i == NEXT_OF_P0:  # the gap seen: a new lineage, announced
            epochs[m], seqs[m] = RESYNCED, 1
            syn.add("subscriptions", subscriber="a0", kind="raw", subject=SUBJECT,
                    event="DATA_RESYNC", member=m, epoch=RESYNCED, seq=1, time=at)
        seqs[m] += 1
        if msg.startswith("p0" if m == MEMBERS[0] else "p1" if m == MEMBERS[1] else "-"):
            syn.add("publishes", publisher=msg.split("-")[0], type="ok", msg_id=msg,
                    subject=SUBJECT, member=m, epoch=epochs[m], seq=seqs[m], time=at + 0.002)
        for name, kind in subs.items():
            if _where(name, at) == m and not (name == "s1" and i == DEAD):
                syn.add("deliveries", subscriber=name, kind=kind, member=m, subject=SUBJECT,
                        epoch=epochs[m], seq=seqs[m], msg_id=msg, type="update",
                        time=at + DELIVERY)
        if m == MEMBERS[2] and at < RESUME <= _next(arrivals, m, at):
            _resume(syn, epochs[m], seqs[m], msg)
    syn.add("subscriptions", subscriber="s1", kind="sdk", event="SERVER_DOWN",
            member=MEMBERS[1], time=KILL + 0.001)
    for time, fault, phase in ((KILL, "kill", "start"), (KILL + 0.01, "kill", "end"),
                               (end, "restart", "start")):
        syn.add("nemesis", time=time, fault=fault, target=MEMBERS[1], phase=phase, detail="")
    for m in MEMBERS:
        syn.add("cluster", time=0.0, member=m, up=True, role="member", ready=True)
    for name, kind in subs.items():
        syn.add("subscriptions", subscriber=name, kind=kind, subject=SUBJECT,
                event="unsubscribed", time=end + 1.0)
    return syn


def _next(arrivals: list[tuple[float, str, str, int]], member: str, after: float) -> float:
    return min((a for a, m, _, _ in arrivals if m == member and a > after), default=1e9)


def _resume(syn: gen.Synthetic, epoch: int, seq: int, last: str) -> None:
    """s1 on migratory-2: the snapshot and DATA_RESYNC at its position."""
    for event, at in (("SERVER_UP", RESUME - 1e-3), ("SUBSCRIBE_ALLOW", RESUME - 5e-4)):
        syn.add("subscriptions", subscriber="s1", kind="sdk", event=event, member=MEMBERS[2],
                subject=SUBJECT if event != "SERVER_UP" else None, time=at)
    syn.add("deliveries", subscriber="s1", kind="sdk", member=MEMBERS[2], subject=SUBJECT,
            epoch=epoch, seq=seq, msg_id=last, type="snapshot", time=RESUME)
    syn.add("subscriptions", subscriber="s1", kind="sdk", subject=SUBJECT, event="DATA_RESYNC",
            member=MEMBERS[2], epoch=epoch, seq=seq, time=RESUME + 1e-5)


def deliveries(syn: gen.Synthetic, who: str) -> list[dict[str, Any]]:
    kind = "raw" if who == "a0" else "sdk"
    return syn.deliveries_of(kind, who, SUBJECT)


# ---- planted faults -------------------------------------------------------------------


def nothing_planted(syn: gen.Synthetic) -> None:
    """The correct history as it is."""


def plant_lost_on_own_member(syn: gen.Synthetic) -> None:
    """s0's last message never delivered, though its own member numbered it."""
    syn.tables["deliveries"].remove(deliveries(syn, "s0")[-1])


def plant_silent_forward_gap(syn: gen.Synthetic) -> None:
    """A forward that never reached migratory-2 after its resync, and no resync again:
    its later messages numbered on as if nothing was missing (no hole to see, only the
    loss). (s1, still on migratory-1 then, got it there.)"""
    ds = [d for d in deliveries(syn, "a0") if d["epoch"] == RESYNCED and d["time"] < KILL]
    gone = next(d for d in ds if d["msg_id"].startswith("p0-") and d["seq"] > 10)
    rows = [r for t in ("deliveries", "subscriptions") for r in syn.tables[t]]
    for r in rows:
        if r.get("epoch") == gone["epoch"] and r.get("seq") is not None and r["seq"] > gone["seq"]:
            r["seq"] -= 1
    syn.tables["deliveries"].remove(gone)


def plant_hole_before_an_announced_gap(syn: gen.Synthetic) -> None:
    """A message missing between two of a0's deliveries in one epoch: a hole, whatever
    the later resync (into another epoch) says; and lost: that resync came after p0's
    next messages, too late to announce it."""
    ds = [d for d in deliveries(syn, "a0") if d["epoch"] == EPOCH[MEMBERS[2]]]
    syn.tables["deliveries"].remove(next(d for d in ds if d["msg_id"].startswith("p0-")
                                         and d["seq"] > 10))


def plant_duplicate_in_one_epoch(syn: gen.Synthetic) -> None:
    d = deliveries(syn, "s0")[40]
    syn.tables["deliveries"].append(dict(d, time=d["time"] + 1e-5))


def plant_reorder(syn: gen.Synthetic) -> None:
    a, b = deliveries(syn, "s0")[40:42]
    for key in ("seq", "msg_id"):
        a[key], b[key] = b[key], a[key]


def plant_unexpected(syn: gen.Synthetic) -> None:
    syn.add("deliveries", subscriber="s0", kind="sdk", member=MEMBERS[0], subject=SUBJECT,
            epoch=12345, seq=1, msg_id="nobody-1", type="update",
            time=deliveries(syn, "s0")[-1]["time"] + 0.1)


def plant_collision(syn: gen.Synthetic) -> None:
    """A second message acknowledged at a position migratory-0 gave, delivered there (and
    forwarded nowhere: lost for a0 and s1, whose members took p0's next ones with no
    resync)."""
    orig = deliveries(syn, "s0")[10]
    ack = next(p for p in syn.tables["publishes"]
               if p["msg_id"] == orig["msg_id"] and p["type"] == "ok")
    msg = "p9-collides"
    syn.add("publishes", publisher="p9", type="invoke", msg_id=msg, subject=SUBJECT,
            member=MEMBERS[0], time=ack["time"] - 0.002)
    syn.add("publishes", publisher="p9", type="ok", msg_id=msg, subject=SUBJECT,
            member=MEMBERS[0], time=ack["time"], epoch=orig["epoch"], seq=orig["seq"])
    syn.tables["deliveries"].append(dict(orig, msg_id=msg, time=orig["time"] + 1e-5))


def _unnumber(syn: gen.Synthetic, gone: dict[str, Any]) -> None:
    """``gone`` removed, and every later position of its epoch moved back by one: no hole
    to see, only the loss."""
    rows = [r for t in ("deliveries", "subscriptions") for r in syn.tables[t]]
    for r in rows:
        if r.get("epoch") == gone["epoch"] and r.get("seq") is not None and r["seq"] > gone["seq"]:
            r["seq"] -= 1
    syn.tables["deliveries"].remove(gone)


def plant_forward_gap_announced_late(syn: gen.Synthetic) -> None:
    """A forward of p0's that never reached migratory-2, a0 told of no gap until the
    resync of a later, unrelated gap -- after it had got p0's next messages: the member
    that took them saw the gap then, and said nothing (the old rule took any later
    DATA_RESYNC for the announcement)."""
    ds = [d for d in deliveries(syn, "a0") if d["epoch"] == EPOCH[MEMBERS[2]]]
    _unnumber(syn, next(d for d in ds if d["msg_id"] == f"p0-{GAP - 20}"))


NEW_LIFE = LATE_AT + 0.3  # migratory-1 back after its kill: p1 publishes there once


def plant_sender_back_unannounced(syn: gen.Synthetic) -> None:
    """migratory-1, killed with ``dead`` in its queue, comes back and forwards p1's next
    message: the members that take it deliver it with no resync (the old rule excused
    ``dead`` by the kill, whenever it was; the sender's next forward shows the loss)."""
    msg, at = "p1-new", NEW_LIFE
    syn.add("nemesis", time=at - 0.2, fault="restart", target=MEMBERS[1], phase="end",
            detail="ready")
    syn.add("publishes", publisher="p1", type="invoke", msg_id=msg, subject=SUBJECT,
            member=MEMBERS[1], time=at, qos="standard")
    syn.add("publishes", publisher="p1", type="ok", msg_id=msg, subject=SUBJECT,
            member=MEMBERS[1], epoch=2100, seq=1, time=at + 0.002)
    last = {m: max((d for d in syn.tables["deliveries"] if d["member"] == m),
                   key=lambda d: d["time"]) for m in (MEMBERS[0], MEMBERS[2])}
    for name, member in (("s0", MEMBERS[0]), ("a0", MEMBERS[2]), ("s1", MEMBERS[2])):
        syn.add("deliveries", subscriber=name, kind="raw" if name == "a0" else "sdk",
                member=member, subject=SUBJECT, epoch=last[member]["epoch"],
                seq=last[member]["seq"] + 1,
                msg_id=msg, type="update", time=at + FORWARD + DELIVERY)


def plant_forward_gap_announced_early(syn: gen.Synthetic) -> None:
    """p1-61's forward never reached migratory-2, and the only resync a0 got after its
    invoke came before a0 got p1-59, p1's message before it: that resync was of another
    gap (a member forwards in the order it numbers; the old rule took any later one)."""
    ds = deliveries(syn, "a0")
    resync = next(r for r in syn.tables["subscriptions"]
                  if r["subscriber"] == "a0" and r["event"] == "DATA_RESYNC")
    _unnumber(syn, next(d for d in ds if d["msg_id"] == f"p1-{NEXT_OF_P0 - 1}"))
    early = next(d for d in ds if d["msg_id"] == f"p1-{NEXT_OF_P0 - 3}")
    _unnumber(syn, early)
    for r in (r for t in ("deliveries", "subscriptions") for r in syn.tables[t]):
        if r.get("epoch") == RESYNCED and r.get("seq") is not None and r["seq"] >= 3:
            r["seq"] += 1
    syn.tables["deliveries"].append(dict(early, epoch=RESYNCED, seq=3,
                                         time=resync["time"] + 0.003))
