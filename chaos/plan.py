"""The workload plan of a chaos run: subjects, publishers and subscribers, from the seed.

Pure: same seed and options -> the same plan (written to ``run.json``). Each subscriber
takes a subset of the subjects, so one subscriber's history stays small enough to
check while every subject is watched by several subscribers of both kinds.

Names say what a client is: ``p<k>`` SDK publishers, ``pr<k>`` raw-protocol
publishers, ``ph<k>`` HTTP publishers (``POST /publish``), ``pm<k>`` MQTT publishers
(QoS 1) (a msg_id starts with its publisher's name, so every one starts with ``p``),
``s<k>`` SDK subscribers, ``a<k>`` raw auditors (the server's test fault switch aims
at client names starting with ``a``), ``m<k>`` MQTT persistent sessions, ``e<k>``
Server-Sent Events streams (EventSource).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

HISTORY = 10  # messages of history asked for by the subscribers that ask for it


@dataclass(frozen=True, slots=True)
class PublisherPlan:
    name: str
    kind: str  # sdk | raw | http | mqtt
    prefer: int  # member index it connects to first
    rate: float  # publishes per second it offers (Poisson arrivals)


@dataclass(frozen=True, slots=True)
class SubscriberPlan:
    name: str
    kind: str  # sdk | raw | mqtt | sse
    prefer: int
    subjects: tuple[str, ...]
    history: int  # 0: the snapshot on the first subscribe; N: the last N cached messages
    start_after: float  # seconds after publishing starts (0: subscribed before it starts)


@dataclass(frozen=True, slots=True)
class WorkloadPlan:
    subjects: tuple[str, ...]
    publishers: tuple[PublisherPlan, ...]
    subscribers: tuple[SubscriberPlan, ...]
    retained_share: float  # of publishes sent retained
    fields_share: float  # of publishes that carry fields beyond msg_id

    @property
    def rate(self) -> float:
        return sum(p.rate for p in self.publishers)


def subject_name(i: int) -> str:
    return f"/chaos/s{i}"


def plan_workload(
    seed: int,
    *,
    members: int,
    subjects: int = 50,
    rate: float = 420.0,
    sdk_publishers: int = 4,
    raw_publishers: int = 4,
    sdk_subscribers: int = 14,
    auditors: int = 6,
    mqtt_subscribers: int = 0,
    sse_subscribers: int = 0,
    http_publishers: int = 0,
    mqtt_publishers: int = 0,
    per_subscriber: int | None = None,
    late_start: float = 8.0,
) -> WorkloadPlan:
    """``rate`` publishes/s offered in all, split evenly over every publisher.

    Every third subscriber of each kind asks for history and subscribes late (after
    ``late_start`` s and a little more per subscriber), so there is history to give.
    ``per_subscriber`` subjects each (default: an eighth of them, at least 2); every
    subject gets at least one subscriber of each kind. MQTT and SSE subscribers (none by
    default: the plan of the other kinds does not change with them) take no history
    (neither MQTT nor ``GET /events`` asks for any).
    """
    if subjects < 1 or members < 1:
        raise ValueError("need at least one subject and one member")
    if not rate > 0:  # (a negative rate's arrivals ran backwards: a loop without end)
        raise ValueError(f"the publish rate must be more than 0, got {rate}")
    if sdk_publishers + raw_publishers + http_publishers + mqtt_publishers < 1 or (
        sdk_subscribers + auditors < 1
    ):
        raise ValueError("need at least one publisher and one subscriber")
    rng = random.Random(f"workload-{seed}")
    names = tuple(subject_name(i) for i in range(subjects))
    count = per_subscriber or max(2, subjects // 8)
    count = min(count, subjects)
    kinds_of_publishers = (
        ("sdk", "p", sdk_publishers), ("raw", "pr", raw_publishers),
        ("http", "ph", http_publishers), ("mqtt", "pm", mqtt_publishers),
    )
    per_pub = rate / sum(n for _, _, n in kinds_of_publishers)
    pubs: list[PublisherPlan] = []
    for kind, prefix, n in kinds_of_publishers:
        pubs += [PublisherPlan(f"{prefix}{k}", kind, (len(pubs) + k) % members, per_pub)
                 for k in range(n)]
    subs: list[SubscriberPlan] = []
    kinds = (
        ("sdk", "s", sdk_subscribers), ("raw", "a", auditors), ("mqtt", "m", mqtt_subscribers),
        ("sse", "e", sse_subscribers),
    )
    for kind, prefix, n in kinds:
        chosen = [set(rng.sample(names, count)) for _ in range(n)]
        if n:  # every subject watched by this kind: give the unwatched ones out in turn
            watched = set().union(*chosen)
            for j, s in enumerate(x for x in names if x not in watched):
                chosen[j % n].add(s)
        for k in range(n):
            late = k % 3 == 2
            subs.append(
                SubscriberPlan(
                    name=f"{prefix}{k}",
                    kind=kind,
                    prefer=(k + 1 if kind != "raw" else members - 1 - k) % members,
                    subjects=tuple(s for s in names if s in chosen[k]),
                    history=HISTORY if late and kind in ("sdk", "raw") else 0,
                    start_after=round(late_start + 1.5 * k, 2) if late else 0.0,
                )
            )
    return WorkloadPlan(names, tuple(pubs), tuple(subs), retained_share=0.3, fields_share=0.5)
