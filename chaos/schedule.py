"""The seeded nemesis schedule: generated up front from ``random.Random(seed)``.

Same seed, duration and layout -> the same schedule. Two kinds of faults:

- **Single faults** (kill, pause, leave, delay, blackhole, partition, reset) of one
  member, one every 0.25-0.85 s: a member has at most one at a time, and at most a
  minority of the seeds ((seeds - 1) // 2) is under one at once.
- **Scenarios** (:data:`SCENARIOS`), one every ~20 s from 10 s on, aimed at what the
  minority rule keeps away: a lagging follower when the leader dies, the leader
  killed while it sends a cache sync, loss of the seed majority, every seed killed
  and restarted after a Raft log compaction, a non-seed's upstream seed stopped, a
  seed's data directory lost (every other time while the leader is down). A
  scenario's window (:data:`LEAD` s before it, its duration and :data:`SETTLE` s
  after) is its own: no single fault of a seed is active in it, nor one of the
  non-seed it uses (so that restarts from earlier kills are over when it starts).
- **Restarts of every member** (:data:`RESTARTS`: ``whole-restart``, ``rolling-restart``)
  only when asked for (``--scenario``, :func:`generate`'s ``forced``): they are never in
  the seeded rotation, so a seed's schedule is the one it always was.

Target ``"leader"`` is resolved when the fault is applied (the current Raft leader)
and counts as a seed; ``"seeds"`` means several seeds, chosen when applied;
``"upstream-of-migratory-i"`` the seed non-seed i replicates from then.
"""

from __future__ import annotations

import json
import random
import re
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
# scenario -> what it needs: non-seeds (True) or not
SCENARIOS = {
    "lagging-failover": False,  # pause a follower seed, resume it and kill the leader at once
    "sync-kill": True,  # kill the leader while it sends a cache sync to a restarted non-seed
    "majority-loss": False,  # a majority of the seeds killed / stopped / cut off for a while
    "all-seeds-restart": False,  # every seed SIGKILLed and restarted after a log compaction
    "upstream-stop": True,  # SIGSTOP the seed a non-seed replicates from
    "lose-disk": False,  # a seed SIGKILLed, its ClusterDataDir deleted, restarted
}
# opt-in scenarios of every member (target "all"), only with --scenario: what operators do
# every week. whole-restart: every member SIGKILLed (or SIGTERMed: it drains) at once, all
# started again; rolling-restart: one member at a time, highest ordinal first (a
# StatefulSet's rolling update), SIGTERM, its exit, restart, ready, then the next.
RESTARTS = ("whole-restart", "rolling-restart")
# opt-in combinations of faults (chaos/combos.py), only with --scenario: several faults at
# once, each of which a single fault or a scenario makes alone. kind -> seeds it needs
COMBOS = {
    "partition-lag-kill": 3,  # a follower delayed, one-way partition into the leader, its kill
    "compaction-blackhole": 3,  # a seed black-holed as it compacts, then every seed restarted
    "pause-forwarding": 3,  # clients driven off the seeds, then the leader SIGSTOPped
    "reset-roll": 3,  # every link reset every 2 s during a rolling restart
    "lost-disks-pause": 5,  # a follower paused while two others lose their disks, leader killed
    "slow-election": 3,  # every seed's peer links delayed (RTT > election timeout), leader killed
}
RESET_EVERY = 2.0  # reset-roll: seconds between resets of every link
RESET_FOR = 30.0  # reset-roll: seconds of resets
WHOLE_RESTART_HOW = ("kill", "term")
# the seconds planned for members to be ready again (the faults' durations; single faults
# stay out of the window): after a whole restart, and per member of a rolling restart
# (drain, start, ready). Busy 2-core box (load 15): a cold cluster's members took 12-19 s,
# each member of a roll 8-15 s
WHOLE_READY = 12.0
ROLL_STEP = 12.0
MAJORITY_LOSS = ("kill", "pause", "raft-cut")  # raft-cut: every seed's Raft links held
LOSE_DISK_WITH = ("kill", "pause")  # what happens to the leader while a seed loses its disk
SCENARIO_EVERY = 20.0  # seconds between scenario starts (+- 3 s)
FIRST_SCENARIO = 10.0
EARLIEST = {"all-seeds-restart": 25.0}  # after the first Raft log compactions
SETTLE = 4.0  # seconds after a scenario's planned end kept free of seed faults
LEAD = 4.0  # seconds before a scenario by which single faults of its members have ended
SCENARIOS_FROM = 30.0  # shorter runs (the checked fault-switch runs) have single faults only


@dataclass(frozen=True, slots=True)
class Fault:
    at: float  # seconds after the workload starts
    fault: str
    target: str  # "migratory-i", "leader", "seeds" or "upstream-of-migratory-i"
    duration: float  # 0 for instantaneous faults (reset)
    detail: str = ""

    @property
    def end(self) -> float:
        return self.at + self.duration

    @property
    def scenario(self) -> bool:
        return self.fault in SCENARIOS or self.fault in RESTARTS or self.fault in COMBOS


def member(i: int) -> str:
    return f"migratory-{i}"


def index(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def touches_seeds(f: Fault, seeds: int) -> bool:
    return f.target in ("leader", "seeds", "all") or f.target.startswith("upstream-of-") or (
        f.target.startswith("migratory-") and index(f.target) < seeds
    )


def _scenario(rng: random.Random, kind: str, at: float, members: int, seeds: int,
              proxies: bool, combined: bool = True) -> Fault:
    """One scenario fault; ``combined``: a lose-disk while the leader is down too."""
    non_seed = member(rng.randrange(seeds, members)) if members > seeds else ""
    if kind == "lagging-failover":
        pause, down = round(rng.uniform(2.5, 3.5), 2), round(rng.uniform(1.0, 3.0), 2)
        return Fault(at, kind, "leader", round(pause + down, 2),
                     f"follower paused {pause}s, then the leader killed for {down}s")
    if kind == "sync-kill":
        down = round(rng.uniform(1.0, 3.0), 2)
        return Fault(at, kind, "leader", down,
                     f"{non_seed} restarted; the leader killed for {down}s while syncing it")
    if kind == "majority-loss":
        how = rng.choice(MAJORITY_LOSS if proxies else MAJORITY_LOSS[:2])
        length = round(rng.uniform(6.0, 9.0), 2)
        if how == "raft-cut":
            return Fault(at, kind, "seeds", length, "raft-cut: the Raft links of every seed held")
        return Fault(at, kind, "seeds", length, f"{how} {seeds // 2 + 1} of {seeds} seeds")
    if kind == "all-seeds-restart":
        down = round(rng.uniform(1.0, 2.5), 2)
        return Fault(at, kind, "seeds", down, f"every seed killed for {down}s after compaction")
    if kind == "lose-disk":
        return _lose_disk(rng, at, seeds, combined)
    if kind == "whole-restart":
        how, down = rng.choice(WHOLE_RESTART_HOW), round(rng.uniform(1.0, 3.0), 2)
        return Fault(at, kind, "all", round(down + WHOLE_READY, 2),
                     f"{how} every member, all down for {down}s")
    if kind == "rolling-restart":
        order = ", ".join(member(i) for i in reversed(range(members)))
        return Fault(at, kind, "all", ROLL_STEP * members,
                     f"SIGTERM, exit, restart, ready, one at a time: {order}")
    if kind in COMBOS:
        return _combo(rng, kind, at, members)
    length = round(rng.uniform(3.0, 6.0), 2)
    return Fault(at, kind, f"upstream-of-{non_seed}", length, f"SIGSTOP for {length}s")


def _combo(rng: random.Random, kind: str, at: float, members: int) -> Fault:
    """A combination (:data:`COMBOS`); its times are the numbers of its detail, in the
    order :func:`combo_times` gives them."""
    def draw(a: float, b: float) -> float:
        return round(rng.uniform(a, b), 2)

    if kind == "partition-lag-kill":
        lag, cut, down = draw(1.5, 2.5), draw(2.0, 4.0), draw(1.0, 3.0)
        return Fault(at, kind, "leader", round(lag + cut + down, 2),
                     f"a follower's peer links delayed 300ms; {lag}s later the leader's "
                     f"inbound peer links held for {cut}s, then the leader killed for {down}s")
    if kind == "compaction-blackhole":
        cut, down = draw(2.0, 4.0), draw(1.0, 2.5)
        who = rng.choice(("leader", "follower"))
        return Fault(at, kind, "seeds", round(cut + down, 2),
                     f"the {who}'s peer links black-holed for {cut}s as it compacts its "
                     f"Raft log, then every seed killed for {down}s")
    if kind == "pause-forwarding":
        move, stop, after = draw(3.0, 4.0), draw(2.0, 4.0), draw(1.0, 2.0)
        return Fault(at, kind, "leader", round(move + stop + after, 2),
                     f"every seed's client links black-holed; {move}s later the leader "
                     f"paused for {stop}s; healed {after}s after it resumes")
    if kind == "reset-roll":
        order = ", ".join(member(i) for i in reversed(range(members)))
        return Fault(at, kind, "all", ROLL_STEP * members,
                     f"every link reset every {RESET_EVERY:g}s for {RESET_FOR:g}s during a "
                     f"rolling restart: {order}")
    if kind == "slow-election":
        ms, lag, down = rng.choice((150, 200, 300)), draw(2.0, 3.0), draw(2.0, 4.0)
        return Fault(at, kind, "leader", round(lag + down, 2),
                     f"every seed's peer links delayed {ms}ms; {lag}s later the leader "
                     f"killed for {down}s")
    paused, down = draw(4.0, 6.0), draw(1.5, 3.0)
    return Fault(at, kind, "seeds", round(paused + down, 2),
                 f"a follower paused for {paused}s, 1.5s in two other followers killed and "
                 f"their ClusterDataDir deleted; as it resumes the leader killed for {down}s")


def combo_times(f: Fault) -> list[float]:
    """The times (s) a combination's detail names, in its order (300ms -> 0.3)."""
    found = re.findall(r"(\d+(?:\.\d+)?)(ms|s)\b", f.detail)
    return [float(n) / (1000 if unit == "ms" else 1) for n, unit in found]


def _lose_disk(rng: random.Random, at: float, seeds: int, combined: bool) -> Fault:
    """Alone: one seed (any, the leader too) SIGKILLed, its ClusterDataDir deleted,
    restarted at once. Combined: a follower seed killed for ``lag`` s (it misses what is
    committed meanwhile), then the leader killed or paused for ``down`` s, and as the
    leader goes the other follower loses its disk: the two seeds up are one that is
    behind and one that is empty, and only the leader holds everything. With 5 seeds,
    two lag and one more goes down with the leader (chaos/scenarios.py ``lose_disk``):
    again only the empty seed's vote could make a majority."""
    if not combined:
        return Fault(at, "lose-disk", member(rng.randrange(seeds)), 1.0,
                     "alone: SIGKILL, ClusterDataDir deleted, restart")
    how = rng.choice(LOSE_DISK_WITH)
    lag, down = round(rng.uniform(1.5, 2.5), 2), round(rng.uniform(4.0, 6.0), 2)
    return Fault(at, "lose-disk", "seeds", round(lag + down, 2),
                 f"leader {how} for {down}s while a follower loses its ClusterDataDir; "
                 f"the other follower killed {lag}s before")


def lose_disk_plan(f: Fault) -> tuple[str, float, float] | None:
    """A combined lose-disk's (what happens to the leader, its downtime, the lagging
    follower's head start) in (str, s, s); None for one alone."""
    if not f.detail.startswith("leader "):
        return None
    words = f.detail.split()
    down, lag = float(words[3].rstrip("s")), float(words[words.index("killed") + 1].rstrip("s"))
    return words[1], down, lag


def lag_and_down(f: Fault) -> tuple[float, float]:
    """A lagging-failover's (pause of the follower, downtime of the leader) in seconds."""
    words = f.detail.split()
    return float(words[words.index("paused") + 1].rstrip("s,")), float(words[-1].rstrip("s"))


def whole_restart_plan(f: Fault) -> tuple[str, float]:
    """A whole-restart's signal, "kill" (SIGKILL) or "term" (SIGTERM, a drain), and how
    long (s) every member stays down once all have exited."""
    words = f.detail.split()
    return words[0], float(words[-1].rstrip("s"))


def rolling_order(f: Fault) -> list[int]:
    """A rolling-restart's members, in the order they restart."""
    return [index(name) for name in f.detail.split(": ", 1)[1].split(", ")]


def non_seed_of(f: Fault) -> int:
    """The non-seed a sync-kill restarts or whose upstream an upstream-stop stops."""
    return index(f.target if f.fault == "upstream-stop" else f.detail.split()[0])


def scenarios(
    rng: random.Random, duration: float, *, members: int, seeds: int, proxies: bool, last: float,
    forced: tuple[str, ...] = (),
) -> list[Fault]:
    """The scenario faults: every kind in turn (a seeded order), each once per round;
    lose-disk combined with the leader down in its 1st, 3rd ... occurrence, alone in the
    others. ``forced``: these kinds only (any length of run), a scenario starting no
    sooner than :data:`LEAD` + :data:`SETTLE` s after the previous one's end."""
    kinds = [k for k, needs_non_seed in SCENARIOS.items() if members > seeds or not needs_non_seed]
    if forced:
        kinds = [k for k in forced if (members > seeds or not SCENARIOS.get(k, False))
                 and seeds >= COMBOS.get(k, 0)]
    out: list[Fault] = []
    if duration < SCENARIOS_FROM and not forced:
        return out
    queue: list[str] = []
    lost_disks = 0
    t = FIRST_SCENARIO + rng.uniform(-2.0, 2.0)
    while t < last:
        if not queue:
            queue = rng.sample(kinds, len(kinds))
        kind = next((k for k in queue if t >= EARLIEST.get(k, 0.0)), None)
        if kind is not None:
            combined = lost_disks % 2 == 0
            f = _scenario(rng, kind, round(t, 3), members, seeds, proxies, combined)
            if f.end + 1.0 <= last:
                queue.remove(kind)
                out.append(f)
                lost_disks += kind == "lose-disk"
        t += SCENARIO_EVERY + rng.uniform(-3.0, 3.0)
        if forced and out:  # a long one (a rolling restart) and the next keep apart
            t = max(t, out[-1].end + SETTLE + LEAD)
    return out


def generate(
    seed: int,
    duration: float,
    *,
    members: int = 5,
    seeds: int = 3,
    proxies: bool = True,
    warmup: float = 2.0,
    cooldown: float = 1.5,
    given_scenarios: list[Fault] | None = None,
    forced: tuple[str, ...] = (),
    standard: bool = False,
) -> list[Fault]:
    """The run's schedule: seeded scenarios (or ``given_scenarios``, a written list; or,
    with ``forced``, scenarios of those kinds only) and the single faults around them.
    ``standard`` (a Standard cluster: no Raft): no target "leader", and no scenario but
    the ``forced`` restarts of every member."""
    if standard and given_scenarios is None:
        given_scenarios = [] if not forced else scenarios(
            random.Random(f"scenarios-{seed}"), duration, members=members, seeds=seeds,
            proxies=proxies, last=duration - cooldown,
            forced=tuple(k for k in forced if k in RESTARTS))
    rng = random.Random(seed)
    minority = (seeds - 1) // 2
    kinds = list(PROCESS_FAULTS) + (list(NONSEED_FAULTS) if members > seeds else [])
    kinds += list(PROXY_FAULTS) if proxies else []
    last = duration - cooldown
    big = list(given_scenarios) if given_scenarios is not None else scenarios(
        random.Random(f"scenarios-{seed}"), duration,
        members=members, seeds=seeds, proxies=proxies, last=last, forced=forced,
    )
    out: list[Fault] = []
    t = warmup + rng.uniform(0, 1.0)
    bounded = 0
    while t < last and bounded < 10_000:
        bounded += 1
        t = round(t, 3)  # the start as stored: the checks below see what the schedule says
        active = [f for f in out if f.at <= t < f.end or (f.duration == 0 and f.at == t)]
        busy = {f.target for f in active}
        seed_busy = sum(1 for f in active if touches_seeds(f, seeds))
        kind = rng.choice(kinds)
        length = 0.0 if kind == "reset" else round(rng.uniform(1.0, 4.0), 2)
        length = round(min(length, max(0.0, last - t)), 2)
        if kind == "leave":
            candidates = [member(i) for i in range(seeds, members)]
        else:
            candidates = [member(i) for i in range(members)]
            if kind in ("kill", "pause") and not standard:
                candidates.append("leader")
        candidates = [c for c in candidates if c not in busy]
        # scenario windows overlapping [t, t + length]: no seed, nor their non-seed
        near = [s for s in big if s.at - LEAD < t + length and t < s.end + SETTLE]
        if seed_busy >= minority or "leader" in busy or near:
            candidates = [c for c in candidates if c != "leader" and index(c) >= seeds]
        if any(s.target == "all" for s in near):
            candidates = []
        candidates = [c for c in candidates if not any(c in s.detail + s.target for s in near)]
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
        t += rng.uniform(0.25, 0.85)
    return sorted(out + big, key=lambda f: f.at)


def active_seed_faults(schedule: list[Fault], seeds: int, t: float) -> int:
    """Single faults of seeds active at ``t`` (scenarios excluded: they are exclusive)."""
    return sum(
        1 for f in schedule if f.at <= t < f.end and not f.scenario and touches_seeds(f, seeds)
    )


def to_jsonl(schedule: list[Fault]) -> str:
    return "".join(json.dumps(asdict(f), sort_keys=True) + "\n" for f in schedule)
