"""chaos/workload.py: what the final drain waits for (Workload.drained)."""

from __future__ import annotations

from pathlib import Path

from offline_workload import offline_workload

from chaos.workload import SETTLE, Workload


def _published_to_everyone_but(tmp_path: Path, *, standard: bool) -> tuple[Workload, str, str]:
    w = offline_workload(tmp_path)
    w.standard_mode = standard
    sub, *others = w.plan.subscribers
    subject = sub.subjects[0]
    for s in w.plan.subscribers:
        w.subscribed_at[s.name], w.seen[s.name] = -2.0, set()  # (the clock: h.now())
    w.record_publish("p0", "invoke", "p0-1", subject, "migratory-1", qos="guaranteed")
    w.record_publish("p0", "ok", "p0-1", subject, "migratory-1", -1.0, epoch=7, seq=1)
    for s in others:
        w.seen[s.name].add("p0-1")
    return w, sub.name, subject


def test_a_standard_drain_does_not_wait_for_what_a_resync_announced(tmp_path: Path) -> None:
    """In Standard a DATA_RESYNC after a message's invoke may have announced it lost (a
    forward gap, a failover): the drain stops waiting for it -- it waited for it until its
    5 s without a delivery, and every Standard run ended ``drained=False``. One invoked
    after the resync is waited for."""
    w, name, subject = _published_to_everyone_but(tmp_path, standard=True)
    assert not w.drained()
    w.record_subscription(name, "sdk", subject, "DATA_RESYNC", "migratory-2", 9, 1)
    assert w.drained()
    w.record_publish("p0", "invoke", "p0-2", subject, "migratory-1", qos="guaranteed")
    w.record_publish("p0", "ok", "p0-2", subject, "migratory-1", w.h.now() + 1.0, epoch=7, seq=2)
    for s in w.plan.subscribers:
        if s.name != name and subject in s.subjects:
            w.seen[s.name].add("p0-2")
    assert not w.drained()
    w.seen[name].add("p0-2")
    assert w.drained()
    w.last_delivery = w.h.now()  # a delivery just now: a late forward may still come
    assert not w.drained()
    w.last_delivery -= SETTLE
    assert w.drained()
    w.h.close()


def test_a_guaranteed_drain_waits_whatever_resync_came(tmp_path: Path) -> None:
    """In Guaranteed a resync skips positions (the checker's skips), not whatever was
    invoked before it: the drain waits for the message."""
    w, name, subject = _published_to_everyone_but(tmp_path, standard=False)
    w.record_subscription(name, "sdk", subject, "DATA_RESYNC", "migratory-2", 9, 1)
    assert not w.drained()
    w.seen[name].add("p0-1")
    assert w.drained()
    w.h.close()


def test_a_standard_drain_does_not_wait_for_what_came_before_a_fresh_subscribe(
        tmp_path: Path) -> None:
    """An SDK subscriber asks at once, and is subscribed where it first connects -- a
    fresh SUBSCRIBE_ALLOW with a position, seconds later in a faulty run: what came
    before it is not owed (seed 5: 5 messages of 8 s before one waited for in vain). A
    resume's SUBSCRIBE_ALLOW (no position) starts nothing."""
    w, name, subject = _published_to_everyone_but(tmp_path, standard=True)
    w.record_subscription(name, "sdk", subject, "SUBSCRIBE_ALLOW", "migratory-1")
    assert not w.drained()
    w.record_subscription(name, "sdk", subject, "SUBSCRIBE_ALLOW", "migratory-1", 7, 62)
    assert w.drained()
    w.h.close()
