"""The nemesis scenarios: several steps on several members, aimed at the seeds.

Each one is a schedule fault (:data:`chaos.schedule.SCENARIOS`) applied by
:func:`run_scenario`. It holds every member it uses (as ``faulted``, so no single
fault hits them meanwhile), waiting up to :data:`CLAIM_WAIT` s for them to be free,
else it is skipped. Its steps are written to the nemesis table as the single faults'
rows (kill / restart, pause / resume, blackhole / heal, reset), each ``detail``
starting with the scenario's name:

- ``lagging-failover``: SIGSTOP a follower seed under load, SIGCONT it and SIGKILL
  the leader at once (the follower is now behind the other survivor); restart. The
  follower stays stopped its scheduled time and until every other seed has applied
  :data:`AHEAD_BY` commits past what it had applied when stopped, as their ``/cluster``
  samples show, at most :data:`BEHIND_WAIT` s (on a busy box the load may not commit
  anything in a fixed 3 s: the follower then resumed level with the others, and the
  scenario tested a failover with no one behind). Not behind by then, it is resumed
  and the leader killed anyway, and the run's log says so.
- ``sync-kill``: SIGKILL and restart a non-seed so that it needs a cache sync; the
  other seeds' proxies refuse its links, so it replicates from the leader; once the
  leader has sent it :data:`SYNC_BYTES`, SIGKILL the leader (the non-seed then fails
  over to the others); restart. If the leader moved meanwhile (an election on a busy
  box), or had not sent that much within :data:`SYNC_WATCH` s (a restart that slow),
  all over again (:data:`SYNC_ATTEMPTS` in all; the last attempt kills whatever was
  sent, and says how much).
- ``majority-loss``: a majority of the seeds killed or SIGSTOPped (the leader among
  them), or every seed's Raft links held, for 6-9 s: no publish may be acknowledged.
- ``all-seeds-restart``: once every seed has compacted its Raft log (``raft.dump`` in
  its data dir), SIGKILL every seed, restart them all.
- ``upstream-stop``: SIGSTOP the seed a non-seed replicates from (its ``/cluster``
  ``replicating_from``), then SIGCONT.
- ``lose-disk``: SIGKILL a seed, delete its ``ClusterDataDir``, start it again. Alone,
  the two other seeds are up: it catches up from the leader. Combined: a follower
  killed first (so it lacks what is committed next), then the leader killed or
  SIGSTOPped and at once the other follower loses its disk; both followers restart at
  once, the leader comes back after 4-6 s. Until then the seeds up are an empty one and
  one that is behind: a leader among them would lack acknowledged publications, so the
  empty seed does not vote (``cluster/raft_votes.py``) and the window counts as a lost
  majority (no publish acknowledged in it).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from chaos.members import Member, http_json
from chaos.schedule import (
    COMBOS,
    RESTARTS,
    SCENARIOS,
    Fault,
    index,
    lag_and_down,
    lose_disk_plan,
    member,
    non_seed_of,
)

if TYPE_CHECKING:
    from chaos.nemesis import Nemesis

ALL_SCENARIOS = {*SCENARIOS, *RESTARTS, *COMBOS}
LEADER_WAIT = 3.0  # seconds it waits for a known Raft leader
SYNC_WATCH = 15.0  # seconds sync-kill watches the restarted non-seed
COMPACTION_WAIT = 20.0  # seconds all-seeds-restart waits for every seed's raft.dump
READY_WAIT = 30.0
# seconds a scenario waits for its members to be free of other faults. No single fault of
# them starts from LEAD s before it, but one that ended may still wait for its member's
# restart (READY_WAIT): 12 s skipped a forced reset-roll on a busy box (a member 25 s
# into its restart); a scenario late is better than one skipped
CLAIM_WAIT = READY_WAIT + 5.0
SYNC_BYTES = 64 * 1024  # the leader has sent this much to the restarted non-seed: kill it
SYNC_ATTEMPTS = 3  # sync-kill again when the leader moved during the catch-up
AHEAD_BY = 2
"""Commits every other seed has applied past the paused follower's before a
lagging-failover resumes it (its own sample is read just before the SIGSTOP: it may
apply one more meanwhile)."""
BEHIND_WAIT = 20.0  # s a lagging-failover's follower stays stopped at most


async def run_scenario(nem: Nemesis, f: Fault, start: float) -> None:
    steps = {
        "lagging-failover": lagging_failover,
        "sync-kill": sync_kill,
        "majority-loss": majority_loss,
        "all-seeds-restart": all_seeds_restart,
        "upstream-stop": upstream_stop,
        "lose-disk": lose_disk,
    }
    try:
        await steps[f.fault](nem, f, start)
    except Exception as exc:
        nem.say(f"scenario {f.fault} failed: {type(exc).__name__}: {exc}")


@contextlib.asynccontextmanager
async def holding(nem: Nemesis, f: Fault, indexes: list[int]) -> AsyncIterator[bool]:
    """Hold ``indexes`` for the scenario (yields False, holding nothing, if they stay
    under other faults for :data:`CLAIM_WAIT` s: the scenario is then skipped).

    Scenarios go one after another in the schedule's order: while an earlier scenario
    holds or waits for members, this one waits (its CLAIM_WAIT counts from then), so a
    busy box that makes a scenario late delays the next ones, never skips them."""
    held = False
    nem.scenarios_waiting.append(f)
    try:
        with trio.move_on_after(CLAIM_WAIT) as claim:
            while True:
                earlier = [w for w in nem.scenarios_waiting if w.at < f.at]
                scenario_busy = [i for i in indexes if nem.faulted.get(i) in ALL_SCENARIOS]
                if earlier or scenario_busy:
                    claim.deadline = trio.current_time() + CLAIM_WAIT
                elif not any(i in nem.faulted for i in indexes):
                    held = True
                    break
                await trio.sleep(0.1)
    finally:
        nem.scenarios_waiting.remove(f)
    if not held:
        busy = sorted(member(i) for i in indexes if i in nem.faulted)
        nem.skip(f, f"{', '.join(busy)} still under other faults")
        yield False
        return
    for i in indexes:
        nem.faulted[i] = f.fault
    nem.applied[f.fault] = nem.applied.get(f.fault, 0) + 1
    nem.say(f"scenario {f.fault}: {f.detail}")
    try:
        yield True
    finally:
        for i in indexes:
            if nem.faulted.get(i) == f.fault:
                del nem.faulted[i]


async def leader(nem: Nemesis) -> int | None:
    with trio.move_on_after(LEADER_WAIT):
        while True:
            i = nem.current_leader(faulted_too=True)
            if i is not None and i < nem.seeds:
                return i
            await trio.sleep(0.1)
    return None


async def cluster_status(m: Member) -> dict[str, Any]:
    _, st = await trio.to_thread.run_sync(http_json, m.http_port, "/cluster", 0.3)
    return st if isinstance(st, dict) else {}


def member_at(nem: Nemesis, address: Any) -> int | None:
    for m in nem.members:
        if m.settings["ClusterMemberListen"] == address:
            return m.index
    return None


def _leader_word(nem: Nemesis, i: int) -> str:
    """"leader, " when the last samples show member i as Raft leader (for the checker)."""
    return "leader, " if nem.current_leader(faulted_too=True) == i else ""


async def lagging_failover(nem: Nemesis, f: Fault, start: float) -> None:
    lag, down = lag_and_down(f)
    seeds = list(range(nem.seeds))
    async with holding(nem, f, seeds) as held:
        lead = await leader(nem) if held else None
        if lead is None:
            if held:
                nem.say("lagging-failover: no Raft leader known; nothing done")
            return
        follower = next(i for i in seeds if i != lead)
        lagging = nem.members[follower]
        applied = await _applied(nem, follower)
        nem.pause(lagging, f"lagging-failover: follower stopped {lag}s under load")
        await _until_behind(nem, follower, applied, lag)
        now = nem.current_leader(faulted_too=True)  # the leader now (rarely another one)
        old = nem.members[now if now is not None and now != follower else lead]
        nem.resume(lagging, "lagging-failover")
        word = _leader_word(nem, old.index)
        await nem.kill(old, f"{word}lagging-failover: killed as {lagging.name} resumed")
        await trio.sleep(down)
        nem.restart(old, "lagging-failover")
        await nem.restarted([old], READY_WAIT)


async def _applied(nem: Nemesis, i: int) -> int | None:
    """Member ``i``'s applied clsn: asked now, else its last sample's (None: unknown)."""
    clsn = (await cluster_status(nem.members[i])).get("applied_clsn")
    if not isinstance(clsn, int):
        clsn = nem.status.get(i, {}).get("applied_clsn")
    return clsn if isinstance(clsn, int) else None


def _behind(nem: Nemesis, follower: int, applied: int) -> dict[str, Any]:
    """The other seeds' applied clsns (None: no sample) while one is under ``applied +
    AHEAD_BY``; empty once every one has reached it."""
    others = {nem.members[i].name: nem.status.get(i, {}).get("applied_clsn")
              for i in range(nem.seeds) if i != follower}
    if all(isinstance(c, int) and c >= applied + AHEAD_BY for c in others.values()):
        return {}
    return others


async def _until_behind(nem: Nemesis, follower: int, applied: int | None, lag: float) -> None:
    """At least ``lag`` s, and until every other seed is :data:`AHEAD_BY` commits past
    the stopped ``follower``'s ``applied`` clsn, at most :data:`BEHIND_WAIT` s."""
    await trio.sleep(lag)
    if applied is None:
        nem.say(f"lagging-failover: {nem.members[follower].name}'s applied clsn unknown "
                f"at its stop; resumed after {lag}s")
        return
    others: dict[str, Any] = {}
    with trio.move_on_after(BEHIND_WAIT - lag):
        while others := _behind(nem, follower, applied):
            await trio.sleep(0.1)
    if others:
        nem.say(f"lagging-failover: {nem.members[follower].name} not behind within "
                f"{BEHIND_WAIT:g}s (it had applied {applied}; the others {others}): the "
                "leader killed anyway")


async def sync_kill(nem: Nemesis, f: Fault, start: float) -> None:
    ns = nem.members[non_seed_of(f)]
    async with holding(nem, f, [*range(nem.seeds), ns.index]) as held:
        seed = None
        for attempt in range(1, SYNC_ATTEMPTS + 1):
            lead = await leader(nem) if held else None
            if lead is None:
                if held:
                    nem.say("sync-kill: no Raft leader known; nothing done")
                return
            seed = await _sync_then_kill(nem, ns, lead, last=attempt == SYNC_ATTEMPTS)
            if seed is not None:
                break
            await nem.restarted([ns], READY_WAIT)  # and again, from the new leader
        async with trio.open_nursery() as nursery:
            nursery.start_soon(nem.restarted, [ns], READY_WAIT)
            await trio.sleep(f.duration)
            if seed is not None:
                nem.restart(seed, "sync-kill")
                await nem.restarted([seed], READY_WAIT)


async def _sync_then_kill(nem: Nemesis, ns: Member, lead: int, *, last: bool) -> Member | None:
    """Restart ``ns`` so that it syncs from ``lead``, then SIGKILL ``lead`` while it sends
    the catch-up -- if the samples still show ``lead`` alone as Raft leader then (or on
    the ``last`` attempt); else None: the leader moved meanwhile (an election on a busy
    box), and the scenario is tried again with the new one."""
    await nem.kill(ns, "sync-kill: so that it needs a cache sync")
    nem.restart(ns, "sync-kill")
    pid = ns.process.pid if ns.process is not None else 0
    seed = nem.members[lead]
    try:
        if nem.proxy_of:
            reached, why = await _leader_sending(nem, lead, pid)
        else:
            reached, why = True, await _replicating(ns, nem, lead)
        if not reached and not last:  # (a restart slower than SYNC_WATCH: a busy box)
            nem.say(f"sync-kill: {seed.name} had not sent the catch-up ({why}); again")
            return None
        if nem.leaders() != {lead} and not last:
            now = sorted(member(i) for i in nem.leaders())
            nem.say(f"sync-kill: {seed.name} no longer leads ({now}) after {why}; again")
            return None
        word = _leader_word(nem, lead)
        detail = f"{word}sync-kill: while it sends {ns.name} its catch-up ({why})"
        await nem.kill(seed, detail)
        return seed
    finally:
        for i in range(nem.seeds):
            for proxy in nem.proxy_of.get(i, [])[:1]:
                proxy.refuse(None)  # the non-seed may now fail over to the others
                proxy.follow(None)


async def _leader_sending(nem: Nemesis, lead: int, pid: int) -> tuple[bool, str]:
    """Wait until the leader has sent :data:`SYNC_BYTES` to process ``pid`` (its other
    seeds refuse ``pid``'s links meanwhile, so it can only replicate from the leader), at
    most :data:`SYNC_WATCH` s: whether it has, and what was sent."""
    for i in range(nem.seeds):
        if i != lead:
            nem.proxy_of[i][0].refuse(pid)
    follow = nem.proxy_of[lead][0].follow(pid, SYNC_BYTES)
    assert follow is not None
    with trio.move_on_after(SYNC_WATCH):
        await follow.reached.wait()
    nem.proxy_of[lead][0].follow(None)
    since = "" if follow.first is None else f" in {trio.current_time() - follow.first:.2f}s"
    return follow.reached.is_set(), f"{follow.bytes // 1024} KiB sent{since}"


async def _replicating(ns: Member, nem: Nemesis, lead: int) -> str:
    """Without proxies: wait until ``ns`` says it replicates (from any seed)."""
    with trio.move_on_after(SYNC_WATCH):
        while True:
            st = await cluster_status(ns)
            upstream = member_at(nem, st.get("replicating_from"))
            if upstream is not None:
                where = "from it" if upstream == lead else f"from {member(upstream)}"
                return f"replicating {where}: {st.get('not_ready_reason') or 'ready'}"
            await trio.sleep(0.03)
    return "not replicating yet"


async def majority_loss(nem: Nemesis, f: Fault, start: float) -> None:
    how = f.detail.split()[0].rstrip(":")
    seeds = list(range(nem.seeds))
    async with holding(nem, f, seeds) as held:
        if not held:
            return
        detail = f"majority-loss: {f.detail}"
        if how == "raft-cut":
            for i in seeds:
                nem.proxy_of[i][1].set(blackhole=True)
                nem.record("blackhole", member(i), "start", detail)
            lost = nem.h.now()
            await trio.sleep(f.duration)
            nem.majority_lost.append((lost, nem.h.now(), f.detail))
            for i in seeds:
                nem.proxy_of[i][1].heal()
                nem.record("blackhole", member(i), "end", detail)
                nem.record("heal", member(i), "start", "blackhole")
                nem.record("heal", member(i), "end", "blackhole")
            return
        lead = await leader(nem)
        order = sorted(seeds, key=lambda i: (i != lead, i))
        victims = [nem.members[i] for i in order[: nem.seeds // 2 + 1]]
        for m in victims:
            if how == "kill":
                await nem.kill(m, _leader_word(nem, m.index) + detail)
            else:
                nem.pause(m, _leader_word(nem, m.index) + detail)
        lost = nem.h.now()
        await trio.sleep(f.duration)
        nem.majority_lost.append((lost, nem.h.now(), f.detail))
        for m in victims:
            if how == "kill":
                nem.restart(m, "majority-loss")
            else:
                nem.resume(m, "majority-loss")
        if how == "kill":
            await nem.restarted(victims, READY_WAIT)


def compacted(m: Member) -> bool:
    data = m.settings.get("ClusterDataDir")
    return data is not None and bool(data) and (Path(data) / "raft.dump").exists()


async def all_seeds_restart(nem: Nemesis, f: Fault, start: float) -> None:
    seeds = [nem.members[i] for i in range(nem.seeds)]
    async with holding(nem, f, [m.index for m in seeds]) as held:
        if not held:
            return
        with trio.move_on_after(COMPACTION_WAIT):
            while not all(compacted(m) for m in seeds):
                await trio.sleep(0.2)
        dumps = [m.name for m in seeds if compacted(m)]
        detail = f"all-seeds-restart: Raft log compacted on {len(dumps)} of {len(seeds)} seeds"
        for m in seeds:
            await nem.kill(m, _leader_word(nem, m.index) + detail)
        lost = nem.h.now()
        await trio.sleep(f.duration)
        nem.majority_lost.append((lost, nem.h.now(), "every seed killed"))
        for m in seeds:
            nem.restart(m, "all-seeds-restart")
        await nem.restarted(seeds, READY_WAIT)


async def upstream_stop(nem: Nemesis, f: Fault, start: float) -> None:
    ns = nem.members[non_seed_of(f)]
    upstream = None
    with trio.move_on_after(3.0):
        while upstream is None:
            upstream = member_at(nem, (await cluster_status(ns)).get("replicating_from"))
            if upstream is None:
                await trio.sleep(0.1)
    if upstream is None:
        nem.skip(f, f"{ns.name} replicates from no seed")
        return
    async with holding(nem, f, [upstream, ns.index]) as held:
        if not held:
            return
        seed = nem.members[upstream]
        word = _leader_word(nem, upstream)
        nem.pause(seed, f"{word}upstream-stop: the seed {ns.name} replicates from")
        await trio.sleep(f.duration)
        nem.resume(seed, "upstream-stop")


def delete_data_dir(m: Member) -> int:
    """Delete the (stopped) member's ``ClusterDataDir``; the number of files it held."""
    data = Path(m.settings["ClusterDataDir"])
    files = sum(1 for p in data.rglob("*") if p.is_file()) if data.is_dir() else 0
    shutil.rmtree(data, ignore_errors=True)
    return files


async def lose_disk(nem: Nemesis, f: Fault, start: float) -> None:
    plan = lose_disk_plan(f)
    seeds = list(range(nem.seeds))
    async with holding(nem, f, seeds) as held:
        if not held:
            return
        if plan is None:
            victim = nem.members[index(f.target)]
            files = await _wipe(nem, victim, _leader_word(nem, victim.index) + "lose-disk: alone")
            nem.restart(victim, f"lose-disk: ClusterDataDir deleted ({files} files)")
            await nem.restarted([victim], READY_WAIT)
            return
        how, down, lag = plan
        lead = await leader(nem)
        if lead is None:
            nem.say("lose-disk: no Raft leader known; nothing done")
            return
        keeper = nem.members[lead]
        # Up while the leader is down: the wiped seed and a majority less one of seeds
        # that lag, so that only the empty seed's vote could make a majority; the others
        # go down with the leader. With 3 seeds: one behind, none else down. With 5, two
        # behind and one more down (before, the two untouched seeds and the one behind
        # were a majority: they committed, legitimately, inside a window the run then
        # reported as "acknowledged inside (must be 0)").
        others = [nem.members[(lead + k) % nem.seeds] for k in range(1, nem.seeds)]
        majority = nem.seeds // 2 + 1
        wiped, behind, down_too = others[0], others[1:majority], others[majority:]
        # no "leader" in the followers' rows: the checker takes such rows for leader faults
        for m in behind:
            await nem.kill(m, f"lose-disk: killed {lag}s early, so that it lags")
        await trio.sleep(lag)
        detail = f"leader, lose-disk: {how} for {down}s as {wiped.name} loses its disk"
        away = [keeper, *down_too]
        for m in away:
            what = detail if m is keeper else f"lose-disk: {how} while {keeper.name} is down"
            if how == "kill":
                await nem.kill(m, what)
            else:
                nem.pause(m, what)
        lost = nem.h.now()
        files = await _wipe(nem, wiped, f"lose-disk: while {keeper.name} (which led) is down")
        nem.restart(wiped, f"lose-disk: ClusterDataDir deleted ({files} files)")
        for m in behind:
            nem.restart(m, "lose-disk")
        await trio.sleep(down)
        nem.majority_lost.append((lost, nem.h.now(), f"lose-disk: {f.detail}"))
        for m in away:
            if how == "kill":
                nem.restart(m, "lose-disk")
            else:
                nem.resume(m, "lose-disk")
        await nem.restarted([wiped, *behind] + (away if how == "kill" else []), READY_WAIT)


async def _wipe(nem: Nemesis, m: Member, detail: str) -> int:
    """SIGKILL ``m`` and delete its ClusterDataDir; the number of files deleted."""
    await nem.kill(m, detail)
    return await trio.to_thread.run_sync(delete_data_dir, m)
