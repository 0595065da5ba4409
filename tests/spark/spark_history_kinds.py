"""The MQTT and SSE subscriber kinds of the synthetic chaos histories
(:mod:`spark_history_gen`), and the violations planted in them."""

from __future__ import annotations

from typing import Any

from spark_history_gen import MEMBERS, Synthetic, _resync_over, _victim

MQTT_VICTIM = ("mqtt", "m0", "/chaos/s0")


def add_mqtt(syn: Synthetic) -> float:
    """An mqtt subscriber m0 that mirrors s0 (its subjects, subscriptions and messages; no
    epoch or seq: the checker takes them from the acks), on connection 1 until s0's
    failover and on connection 2 after it, where the resume first delivers again the last
    two messages of each subject it had (what MQTT QoS 1 and our server allow). Returns
    the time of the second connection."""
    subs, dels = syn.tables["subscriptions"], syn.tables["deliveries"]
    up = next(r["time"] for r in subs if r["subscriber"] == "s0" and r["event"] == "SERVER_UP")
    events = ("subscribed", "unsubscribed", "SERVER_UP", "SERVER_DOWN")
    subs += [dict(r, subscriber="m0", kind="mqtt") for r in list(subs)
             if r["subscriber"] == "s0" and r["event"] in events]
    mine = [d for d in dels if d["subscriber"] == "s0"]
    mqtt = dict(subscriber="m0", kind="mqtt", epoch=None, seq=None, type="update")
    dels += [dict(d, **mqtt, connection=1 if d["time"] < up else 2) for d in mine]
    for subject in sorted({d["subject"] for d in mine}):
        had = sorted((d for d in mine if d["subject"] == subject and d["time"] < up),
                     key=lambda d: d["time"])[-2:]
        dels += [dict(d, **mqtt, connection=2, time=up + 1e-4 * (k + 1))
                 for k, d in enumerate(had)]
    return up


def _mqtt_first(syn: Synthetic) -> list[dict[str, Any]]:
    return [d for d in _victim(syn, MQTT_VICTIM) if d["connection"] == 1]


def plant_mqtt_allowed(syn: Synthetic) -> None:
    """What MQTT and our server allow an mqtt subscriber, none a violation: the messages
    delivered again at a resume (add_mqtt), a standard (QoS 0) message never delivered,
    and a message skipped by a resync (a retained message on the resumed session)."""
    up = add_mqtt(syn)
    ds = _mqtt_first(syn)
    gone = ds[len(ds) // 3]
    syn.tables["deliveries"].remove(gone)
    for p in syn.tables["publishes"]:
        if p["msg_id"] == gone["msg_id"] and p["type"] == "invoke":
            p["qos"] = "standard"
    later = [d for d in _victim(syn, MQTT_VICTIM) if d["time"] > up + 0.5]
    skipped = later[len(later) // 2]
    syn.tables["deliveries"].remove(skipped)
    syn.add("subscriptions", subscriber="m0", kind="mqtt", subject=skipped["subject"],
            event="DATA_RESYNC", member=MEMBERS[1], time=skipped["time"])


def plant_mqtt_lost(syn: Synthetic) -> None:
    add_mqtt(syn)
    ds = _mqtt_first(syn)
    syn.tables["deliveries"].remove(ds[len(ds) // 3])


def plant_mqtt_duplicate(syn: Synthetic) -> None:
    """One message twice on one connection (not a resume's replay)."""
    add_mqtt(syn)
    d = _mqtt_first(syn)[len(_mqtt_first(syn)) // 3]
    syn.tables["deliveries"].append(dict(d, time=d["time"] + 1e-5))


def plant_mqtt_reorder(syn: Synthetic) -> None:
    add_mqtt(syn)
    ds = _mqtt_first(syn)
    a, b = ds[len(ds) // 3], ds[len(ds) // 3 + 1]
    a["msg_id"], b["msg_id"] = b["msg_id"], a["msg_id"]


# ---- a Server-Sent Events subscriber, added by its plants only ----

SSE_VICTIM = ("sse", "e0", "/chaos/s0")


def add_sse(syn: Synthetic) -> None:
    """An sse subscriber e0 that mirrors s0 row for row (its subscriptions, statuses and
    messages, positions included): a stream that fails over with s0 and resumes from its
    Last-Event-ID with the missed messages (recovered) and a DATA_SYNC."""
    for table in ("subscriptions", "deliveries"):
        rows = syn.tables[table]
        rows += [dict(r, subscriber="e0", kind="sse") for r in list(rows)
                 if r["subscriber"] == "s0"]


def plant_sse_lost(syn: Synthetic) -> None:
    """One message missing from a stream, no resync: the checker must name it (sse)."""
    add_sse(syn)
    ds = _victim(syn, SSE_VICTIM)
    syn.tables["deliveries"].remove(ds[len(ds) // 3])


def plant_sse_resync(syn: Synthetic) -> None:
    """Two messages missing from a stream, announced by a DATA_RESYNC (the snapshot
    instead of the missed messages): allowed, nothing to name."""
    add_sse(syn)
    ds = _victim(syn, SSE_VICTIM)
    i = len(ds) // 3
    for gone in ds[i : i + 2]:
        syn.tables["deliveries"].remove(gone)
    _, who, subject = SSE_VICTIM
    syn.add("subscriptions", subscriber=who, kind="sse", subject=subject, event="DATA_RESYNC",
            member=MEMBERS[1], epoch=ds[i + 1]["epoch"], seq=ds[i + 1]["seq"],
            time=(ds[i + 1]["time"] + ds[i + 2]["time"]) / 2)


# ---- publishers whose acknowledgement carries no position (MQTT PUBACK) ----


def _positionless(syn: Synthetic) -> list[dict[str, Any]]:
    """Every publish ack of /chaos/s0 stripped of its position, as an MQTT publisher
    records it (chaos/mqtt_publisher.py); the victim's deliveries."""
    for p in syn.tables["publishes"]:
        if p["type"] == "ok" and p["subject"] == "/chaos/s0":
            p["epoch"] = p["seq"] = None
    return _victim(syn)


def plant_positionless_ack_resync(syn: Synthetic) -> None:
    """A delivery dropped under a DATA_RESYNC, its ack without a position: allowed (the
    position comes from the other subscribers' deliveries). Before the checker filled
    ack positions, the null seq excused nothing: reported lost."""
    ds = _positionless(syn)
    _resync_over(syn, ds, len(ds) // 3)


def plant_positionless_ack_lost(syn: Synthetic) -> None:
    """A delivery dropped, no resync, its ack without a position: lost (and a hole)."""
    ds = _positionless(syn)
    syn.tables["deliveries"].remove(ds[len(ds) // 3])


def _skipped_by_every_positioned_subscriber(syn: Synthetic, keep: str | None) -> None:
    """One message of /chaos/s0 acknowledged as an MQTT publisher's (no position) that no
    subscriber with positions received: each of them (but ``keep``, which just misses
    it) resumed past it with a DATA_RESYNC at its position; the mqtt subscriber m0 got
    it between two messages whose positions are known (what chaos run 2903 met with
    MaxCachedMessagesPerSubject = 30)."""
    add_mqtt(syn)
    target = _mqtt_first(syn)[len(_mqtt_first(syn)) // 3]
    for p in syn.tables["publishes"]:
        if p["type"] == "ok" and p["msg_id"] == target["msg_id"]:
            p["epoch"] = p["seq"] = None
    got = [d for d in syn.tables["deliveries"]
           if d["msg_id"] == target["msg_id"] and d["kind"] != "mqtt"]
    assert got, "a message the positioned subscribers had"
    for d in got:
        syn.tables["deliveries"].remove(d)
        if d["subscriber"] != keep:
            syn.add("subscriptions", subscriber=d["subscriber"], kind=d["kind"],
                    subject=d["subject"], event="DATA_RESYNC", member=MEMBERS[1],
                    epoch=d["epoch"], seq=d["seq"], time=d["time"] + 1e-5)


def plant_positionless_ack_skipped_by_all(syn: Synthetic) -> None:
    """Allowed: the message's seq is bounded by m0's stream, and every resync covers it.
    Before the bounds, reported lost for every subscriber that resynced over it."""
    _skipped_by_every_positioned_subscriber(syn, keep=None)


def plant_positionless_ack_skipped_by_all_but_one(syn: Synthetic) -> None:
    """s0 missed it without a resync: lost (and a hole) for s0 only."""
    _skipped_by_every_positioned_subscriber(syn, keep="s0")


def _resynced_over_everywhere(syn: Synthetic, keep: str | None) -> None:
    """One message of /chaos/s0 acknowledged as an MQTT publisher's (no position) that no
    subscriber received, with no MQTT subscriber to bound it: every subscriber (but
    ``keep``, which just misses it) resumed past it with a DATA_RESYNC at its position --
    what chaos run seed 1173 met with MaxCachedMessagesPerSubject = 5 (three MQTT
    publishes, each resynced over by every subscriber of its subject)."""
    target = _victim(syn)[len(_victim(syn)) // 3]
    for p in syn.tables["publishes"]:
        if p["type"] == "ok" and p["msg_id"] == target["msg_id"]:
            p["epoch"] = p["seq"] = None
    for d in [d for d in syn.tables["deliveries"] if d["msg_id"] == target["msg_id"]]:
        syn.tables["deliveries"].remove(d)
        if d["subscriber"] != keep:
            syn.add("subscriptions", subscriber=d["subscriber"], kind=d["kind"],
                    subject=d["subject"], event="DATA_RESYNC", member=MEMBERS[1],
                    epoch=d["epoch"], seq=d["seq"], time=d["time"] + 1e-5)


def plant_positionless_ack_resynced_over_everywhere(syn: Synthetic) -> None:
    """Allowed: the message's seq is bounded by the order of events (the message before
    it acknowledged before its invoke, the one after it invoked after its ack), and every
    resync covers it. Before those bounds, reported lost for every subscriber."""
    _resynced_over_everywhere(syn, keep=None)


def plant_positionless_ack_resynced_over_but_one(syn: Synthetic) -> None:
    """s0 missed it without a resync: lost (and a hole) for s0 only."""
    _resynced_over_everywhere(syn, keep="s0")


def plant_mqtt_resync_after_an_unacknowledged_message(syn: Synthetic) -> None:
    """Allowed: m0's first message of /chaos/s0 ended ``info`` (no ack: MQTT gives it no
    position, s0 has it at one), m0 missed the next three, then its resume sent the
    snapshot (a DATA_RESYNC without a position), which announces everything after that
    first message. Before the checker took the position from s0's delivery, the resync
    had no starting point and excused nothing: the three reported lost (chaos seeds 1181
    and 1185, CacheMemoryBudget=20000: 14 of 1185's)."""
    add_mqtt(syn)
    first, *gone = sorted(_mqtt_first(syn), key=lambda d: d["time"])[:4]
    for p in syn.tables["publishes"]:
        if p["msg_id"] == first["msg_id"] and p["type"] == "ok":
            p.update(type="info", epoch=None, seq=None, reason="outcome unknown (planted)")
        if p["msg_id"] in {d["msg_id"] for d in gone} and p["type"] == "invoke":
            p["qos"] = "guaranteed"
    for d in gone:
        syn.tables["deliveries"].remove(d)
    syn.add("subscriptions", subscriber="m0", kind="mqtt", subject=first["subject"],
            event="DATA_RESYNC", member=MEMBERS[1], time=gone[-1]["time"] + 1e-5)


def plant_mqtt_resync_before_anything(syn: Synthetic) -> None:
    """Allowed: m0 got nothing of /chaos/s0 before its resumed session was given the
    snapshot (a DATA_RESYNC without a position): every message invoked before it is
    announced (chaos seed 1176 with CacheMemoryBudget=20000: a session subscribed before
    the subject was numbered, dropped before its first message came; before the rule,
    everything it missed was reported lost)."""
    at = add_mqtt(syn) + 0.3
    for d in [d for d in _victim(syn, MQTT_VICTIM) if d["time"] < at]:
        syn.tables["deliveries"].remove(d)
    syn.add("subscriptions", subscriber="m0", kind="mqtt", subject=MQTT_VICTIM[2],
            event="DATA_RESYNC", member=MEMBERS[1], time=at)


def _mqtt_reset(syn: Synthetic, subject: str, missed: int) -> None:
    """m0 missed ``missed`` guaranteed messages of /chaos/s0 on its first connection (a
    member's cache sync moved the live session past its cache), then the server's
    resync of ``subject`` with no snapshot: an empty RETAIN, which the recorder writes
    as a DATA_RESYNC row and no delivery (chaos/mqtt_workload.py)."""
    add_mqtt(syn)
    gone = sorted(_mqtt_first(syn), key=lambda d: d["time"])[5:5 + missed]
    for p in syn.tables["publishes"]:
        if p["msg_id"] in {d["msg_id"] for d in gone} and p["type"] == "invoke":
            p["qos"] = "guaranteed"
    for d in gone:
        syn.tables["deliveries"].remove(d)
    syn.add("subscriptions", subscriber="m0", kind="mqtt", subject=subject,
            event="DATA_RESYNC", member=MEMBERS[0], time=gone[-1]["time"] + 1e-5)


def plant_mqtt_reset_on_a_live_session(syn: Synthetic) -> None:
    """Allowed: the empty RETAIN on /chaos/s0 announces the three m0 missed of it before."""
    _mqtt_reset(syn, MQTT_VICTIM[2], 3)


def plant_mqtt_reset_of_another_subject(syn: Synthetic) -> None:
    """A loss of /chaos/s0 with the empty RETAIN on /chaos/s1: lost (one, as the check
    names each violation once per plant)."""
    _mqtt_reset(syn, "/chaos/s1", 1)
