"""The seeded nemesis schedule: generated up front from ``random.Random(seed)``.

Same seed, duration and layout -> the same schedule. At any moment at most a
minority of the seeds ((seeds - 1) // 2) has an active fault, and a member has
at most one active fault. Target ``"leader"`` is resolved when the fault is
applied (the current Raft leader) and counts as a seed fault.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass

PROCESS_FAULTS = ("kill", "pause")  # any member, incl. the leader
NONSEED_FAULTS = ("leave",)  # non-seed leave, join at the end
PROXY_FAULTS = ("delay", "blackhole", "reset", "partition")
LINK_FAULTS = ("delay", "blackhole", "partition")  # on "peers" (cluster + Raft) or "clients"
HEAL_OF = {
    "kill": "restart",
    "pause": "resume",
    "leave": "join",
    "delay": "heal",
    "blackhole": "heal",
    "partition": "heal",
    "reset": None,
}


@dataclass(frozen=True, slots=True)
class Fault:
    at: float  # seconds after the workload starts
    fault: str
    target: str  # "migratory-i" or "leader"
    duration: float  # 0 for instantaneous faults (reset)
    detail: str = ""

    @property
    def end(self) -> float:
        return self.at + self.duration


def member(i: int) -> str:
    return f"migratory-{i}"


def generate(
    seed: int,
    duration: float,
    *,
    members: int = 5,
    seeds: int = 3,
    proxies: bool = True,
    warmup: float = 2.0,
    cooldown: float = 1.5,
) -> list[Fault]:
    rng = random.Random(seed)
    minority = (seeds - 1) // 2
    kinds = list(PROCESS_FAULTS) + (list(NONSEED_FAULTS) if members > seeds else [])
    kinds += list(PROXY_FAULTS) if proxies else []
    out: list[Fault] = []
    t = warmup + rng.uniform(0, 1.0)
    last = duration - cooldown
    bounded = 0
    while t < last and bounded < 10_000:
        bounded += 1
        active = [f for f in out if f.at <= t < f.end or (f.duration == 0 and f.at == t)]
        busy = {f.target for f in active}
        seed_busy = sum(
            1 for f in active if f.target == "leader" or int(f.target.rsplit("-", 1)[1]) < seeds
        )
        kind = rng.choice(kinds)
        length = 0.0 if kind == "reset" else round(rng.uniform(1.0, 4.0), 2)
        length = round(min(length, max(0.0, last - t)), 2)
        if kind == "leave":
            candidates = [member(i) for i in range(seeds, members)]
        else:
            candidates = [member(i) for i in range(members)]
            if kind in ("kill", "pause"):
                candidates.append("leader")
        candidates = [c for c in candidates if c not in busy]
        if seed_busy >= minority or "leader" in busy:
            candidates = [
                c for c in candidates if c != "leader" and int(c.rsplit("-", 1)[1]) >= seeds
            ]
        if candidates:
            target = rng.choice(candidates)
            detail = ""
            links = rng.choice(("peers", "clients")) if kind in LINK_FAULTS else ""
            if kind == "delay":
                detail = f"{rng.choice((50, 100, 200, 400))}ms {links}"
            elif kind == "blackhole":
                detail = links
            elif kind == "partition":
                detail = f"one-way {links}: into the target held, out of it flows"
            out.append(Fault(round(t, 3), kind, target, length, detail))
        t += rng.uniform(0.8, 2.5)
    return out


def active_seed_faults(schedule: list[Fault], seeds: int, t: float) -> int:
    return sum(
        1
        for f in schedule
        if f.at <= t < f.end and (f.target == "leader" or int(f.target.rsplit("-", 1)[1]) < seeds)
    )


def to_jsonl(schedule: list[Fault]) -> str:
    return "".join(json.dumps(asdict(f), sort_keys=True) + "\n" for f in schedule)
