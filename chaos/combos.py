"""Combinations of faults, opt-in scenarios (``--scenario``; :data:`chaos.schedule.COMBOS`).

Each fault of a combination is one the single faults or the scenarios make alone; what
nobody ran is them at once:

- ``partition-lag-kill``: a follower seed's peer links (cluster + Raft) delayed 300 ms,
  then every link into the leader held (one-way partition: the leader still sends, hears
  nothing), then the leader SIGKILLed; the survivors elect with one of them lagging.
  The delay ends once the leader is ready again.
- ``compaction-blackhole``: a seed's peer links black-holed the moment it compacts its
  Raft log (its ``raft.dump`` rewritten; small ``--compaction`` makes that every few
  seconds), healed, then every seed SIGKILLed and restarted (each loads a dump).
- ``pause-forwarding``: every seed's client links black-holed, so that the clients move
  to the non-seeds, which forward every publish; then the leader SIGSTOPped for longer
  than the election timeout, SIGCONTed, the client links healed.
- ``reset-roll``: a rolling restart while every proxied connection of every member is
  reset every :data:`chaos.schedule.RESET_EVERY` s for :data:`chaos.schedule.RESET_FOR` s.
- ``lost-disks-pause`` (5 seeds): a follower seed SIGSTOPped; two other followers
  SIGKILLed, their ``ClusterDataDir`` deleted, started again (they catch up from the
  leader); as the paused one resumes the leader SIGKILLed: the survivors are one
  up-to-date seed, one behind and two that were empty.
- ``slow-election``: every seed's peer links delayed 150-300 ms (a round trip of twice
  that, longer than the 0.15-0.3 s election timeout), then the leader SIGKILLed: the
  others must elect over links slower than their timers (``ElectionBackoff``).

Rows as the single faults' (``delay`` / ``partition`` / ``blackhole`` / ``heal``,
``kill`` / ``restart``, ``pause`` / ``resume``, ``stop``, ``reset``), each ``detail``
starting with the combination's name ("leader, " before it for the Raft leader).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from chaos.members import Member
from chaos.restarts import roll
from chaos.scenarios import COMPACTION_WAIT, READY_WAIT, _leader_word, _wipe, holding, leader
from chaos.schedule import RESET_EVERY, RESET_FOR, Fault, combo_times, member, rolling_order

if TYPE_CHECKING:
    from chaos.nemesis import Nemesis

PEERS, CLIENTS = slice(0, 2), slice(2, None)  # a member's proxies: cluster + Raft; client (+MQTT)


async def run_combo(nem: Nemesis, f: Fault, start: float) -> None:
    steps = {
        "partition-lag-kill": partition_lag_kill,
        "compaction-blackhole": compaction_blackhole,
        "pause-forwarding": pause_forwarding,
        "reset-roll": reset_roll,
        "lost-disks-pause": lost_disks_pause,
        "slow-election": slow_election,
    }
    if not nem.proxy_of and f.fault != "lost-disks-pause":
        nem.skip(f, "needs the proxies")
        return
    try:
        await steps[f.fault](nem, f)
    except Exception as exc:
        nem.say(f"scenario {f.fault} failed: {type(exc).__name__}: {exc}")


def cut(nem: Nemesis, kind: str, i: int, links: slice, detail: str, delay: float = 0.0) -> None:
    """Start a link fault (``delay``, ``blackhole``, ``partition``) on member i's ``links``."""
    target = f"*->{member(i)}" if kind == "partition" else member(i)
    nem.record(kind, target, "start", detail)
    for p in nem.proxy_of[i][links]:
        if kind == "delay":
            p.set(delay=delay)
        elif kind == "blackhole":
            p.set(blackhole=True)
        else:
            p.set(inbound_dropped=True)


def heal(nem: Nemesis, kind: str, i: int, links: slice, detail: str) -> None:
    target = f"*->{member(i)}" if kind == "partition" else member(i)
    for p in nem.proxy_of[i][links]:
        p.heal()
    nem.record(kind, target, "end", detail)
    nem.record("heal", target, "start", kind)
    nem.record("heal", target, "end", kind)


@contextlib.asynccontextmanager
async def holding_the_leader(
    nem: Nemesis, f: Fault, name: str, indexes: list[int]
) -> AsyncIterator[int | None]:
    """:func:`holding` the members ``indexes``, then the Raft leader's index (None: not
    held, or no leader known -- said so: the combination does nothing)."""
    async with holding(nem, f, indexes) as held:
        lead = await leader(nem) if held else None
        if held and lead is None:
            nem.say(f"{name}: no Raft leader known; nothing done")
        yield lead


async def partition_lag_kill(nem: Nemesis, f: Fault) -> None:
    delay, lag, held_for, down = combo_times(f)
    seeds = list(range(nem.seeds))
    name = "partition-lag-kill"
    async with holding_the_leader(nem, f, name, seeds) as lead:
        if lead is None:
            return
        follower = next(i for i in seeds if i != lead)
        cut(nem, "delay", follower, PEERS, f"{name}: {delay * 1000:g}ms on cluster+raft "
            "links, both ways", delay)
        await trio.sleep(lag)
        word = _leader_word(nem, lead)
        cut(nem, "partition", lead, PEERS, f"{word}{name}: one-way peers: into the leader held")
        await trio.sleep(held_for)
        old = nem.members[lead]
        await nem.kill(old, f"{_leader_word(nem, lead)}{name}: killed, its inbound links held "
                       f"and {member(follower)} lagging")
        heal(nem, "partition", lead, PEERS, name)
        await trio.sleep(down)
        nem.restart(old, name)
        await nem.restarted([old], READY_WAIT)
        heal(nem, "delay", follower, PEERS, name)


def dump_state(m: Member) -> tuple[bool, float | None]:
    """(a dump is being written, the ``raft.dump``'s mtime or None)."""
    data = Path(m.settings.get("ClusterDataDir") or "/nonexistent")
    dump = data / "raft.dump"
    writing = (data / "raft.dump.tmp").exists()
    try:
        return writing, dump.stat().st_mtime
    except OSError:
        return writing, None


async def compacting(m: Member, timeout: float) -> bool:
    """Wait (at most ``timeout`` s) until ``m`` writes a new Raft dump: its temporary file
    is there, or ``raft.dump`` changed since this was called."""
    _, before = dump_state(m)
    with trio.move_on_after(timeout):
        while True:
            writing, now = dump_state(m)
            if writing or now != before:
                return True
            await trio.sleep(0.01)
    return False


async def compaction_blackhole(nem: Nemesis, f: Fault) -> None:
    held_for, down = combo_times(f)
    seeds = [nem.members[i] for i in range(nem.seeds)]
    name = "compaction-blackhole"
    async with holding_the_leader(nem, f, name, [m.index for m in seeds]) as lead:
        if lead is None:
            return
        victim = lead if "the leader's" in f.detail else (lead + 1) % nem.seeds
        seen = await compacting(nem.members[victim], COMPACTION_WAIT)
        when = "as it compacts its Raft log" if seen else f"no compaction in {COMPACTION_WAIT:g}s"
        word = _leader_word(nem, victim)
        cut(nem, "blackhole", victim, PEERS, f"{word}{name}: cluster+raft links, both ways, {when}")
        await trio.sleep(held_for)
        heal(nem, "blackhole", victim, PEERS, name)
        for m in seeds:
            await nem.kill(m, f"{_leader_word(nem, m.index)}{name}: every seed killed")
        lost = nem.h.now()
        await trio.sleep(down)
        nem.majority_lost.append((lost, nem.h.now(), "every seed killed (compaction-blackhole)"))
        for m in seeds:
            nem.restart(m, name)
        await nem.restarted(seeds, READY_WAIT)


async def pause_forwarding(nem: Nemesis, f: Fault) -> None:
    move, stop, after = combo_times(f)
    seeds = list(range(nem.seeds))
    name = "pause-forwarding"
    async with holding(nem, f, seeds) as held:
        if not held:
            return
        for i in seeds:
            cut(nem, "blackhole", i, CLIENTS, f"{name}: client links, both ways")
        try:
            await trio.sleep(move)
            lead = await leader(nem)
            if lead is None:
                nem.say(f"{name}: no Raft leader known; no pause")
                return
            m = nem.members[lead]
            nem.pause(m, f"{_leader_word(nem, lead)}{name}: while the non-seeds forward")
            await trio.sleep(stop)
            nem.resume(m, name)
            await trio.sleep(after)
        finally:
            for i in seeds:
                heal(nem, "blackhole", i, CLIENTS, name)


async def reset_roll(nem: Nemesis, f: Fault) -> None:
    order = rolling_order(f)
    name = "reset-roll"
    async with holding(nem, f, order) as held:
        if not held:
            return

        async def resets() -> None:
            for _ in range(int(RESET_FOR / RESET_EVERY)):
                for i in range(len(nem.members)):
                    nem.record("reset", member(i), "start", f"{name}: every connection")
                    n = sum(p.reset() for p in nem.proxy_of.get(i, []))
                    nem.record("reset", member(i), "end", f"{name}: {n} connections reset")
                await trio.sleep(RESET_EVERY)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(resets)
            await roll(nem, order, name)


async def lost_disks_pause(nem: Nemesis, f: Fault) -> None:
    paused_for, lag, down = combo_times(f)
    seeds = list(range(nem.seeds))
    name = "lost-disks-pause"
    async with holding_the_leader(nem, f, name, seeds) as lead:
        if lead is None:
            return
        behind, *wiped = [nem.members[(lead + k) % nem.seeds] for k in (1, 2, 3)]
        nem.pause(behind, f"{name}: follower paused {paused_for}s")
        await trio.sleep(lag)
        for m in wiped:
            files = await _wipe(nem, m, f"{name}: while {behind.name} is paused")
            nem.restart(m, f"{name}: ClusterDataDir deleted ({files} files)")
        await trio.sleep(max(0.0, paused_for - lag))
        nem.resume(behind, name)
        old = nem.members[lead]
        await nem.kill(old, f"{_leader_word(nem, lead)}{name}: killed as {behind.name} resumes")
        await trio.sleep(down)
        nem.restart(old, name)
        await nem.restarted([*wiped, old], READY_WAIT)


async def slow_election(nem: Nemesis, f: Fault) -> None:
    delay, lag, down = combo_times(f)
    seeds = list(range(nem.seeds))
    name = "slow-election"
    async with holding_the_leader(nem, f, name, seeds) as lead:
        if lead is None:
            return
        for i in seeds:
            cut(nem, "delay", i, PEERS, f"{name}: {delay * 1000:g}ms on cluster+raft links, "
                "both ways", delay)
        try:
            await trio.sleep(lag)
            old = nem.members[lead]
            await nem.kill(old, f"{_leader_word(nem, lead)}{name}: killed, every seed's links "
                           "delayed")
            await trio.sleep(down)
            nem.restart(old, name)
            await nem.restarted([old], READY_WAIT)
        finally:
            for i in seeds:
                heal(nem, "delay", i, PEERS, name)
