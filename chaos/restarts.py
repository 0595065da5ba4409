"""The restarts of every member, opt-in scenarios (``--scenario``; :data:`chaos.schedule.RESTARTS`):
what operators do every week, under the workload.

- ``whole-restart``: every member, seeds and non-seeds, SIGKILLed at once (``kill``) or
  sent SIGTERM at once (``term``: each drains, then exits); once all have exited they
  stay down for the fault's duration, then all are started again. While they are down
  no publish can be acknowledged (a window of ``majority_lost``); afterwards every
  acknowledged publication must still be there and every subscriber resume from its
  position.
- ``rolling-restart``: what ``kubectl rollout restart statefulset`` does. One member at a
  time, highest ordinal first: SIGTERM, wait for it to exit (it drains: its clients go
  to the others), start it again, wait until ``/readyz`` says ready, then the next. A
  member that does not become ready in :data:`READY_WAIT` s halts the roll, as a stuck
  rollout halts (said in a progress line; the rest keep running unrestarted).

Rows: ``kill`` or ``stop`` (SIGTERM) start/end, then ``restart`` start/end, each detail
starting with the scenario's name (and "leader, " when the member led Raft).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from chaos.members import Member
from chaos.scenarios import READY_WAIT, _leader_word, holding
from chaos.schedule import Fault, rolling_order, whole_restart_plan

if TYPE_CHECKING:
    from chaos.nemesis import Nemesis


async def run_restart(nem: Nemesis, f: Fault, start: float) -> None:
    steps = {"whole-restart": whole_restart, "rolling-restart": rolling_restart}
    try:
        await steps[f.fault](nem, f, start)
    except Exception as exc:
        nem.say(f"scenario {f.fault} failed: {type(exc).__name__}: {exc}")


async def whole_restart(nem: Nemesis, f: Fault, start: float) -> None:
    how, down_for = whole_restart_plan(f)
    everyone = list(nem.members)
    async with holding(nem, f, [m.index for m in everyone]) as held:
        if not held:
            return
        detail = f"whole-restart: {f.detail}"

        async def down(m: Member) -> None:
            what = _leader_word(nem, m.index) + detail
            if how == "kill":
                await nem.kill(m, what)
            else:
                await nem.stop(m, what)

        async with trio.open_nursery() as nursery:  # every signal sent at once
            for m in everyone:
                nursery.start_soon(down, m)
        lost = nem.h.now()
        await trio.sleep(down_for)
        nem.majority_lost.append((lost, nem.h.now(), "every member down (whole-restart)"))
        for m in everyone:
            nem.restart(m, "whole-restart", after="kill" if how == "kill" else "stop")
        await nem.restarted(everyone, READY_WAIT)


async def rolling_restart(nem: Nemesis, f: Fault, start: float) -> None:
    order = rolling_order(f)
    async with holding(nem, f, order) as held:
        if held:
            await roll(nem, order, "rolling-restart")


async def roll(nem: Nemesis, order: list[int], name: str) -> bool:
    """Restart ``order`` one at a time (SIGTERM, exit, start, ready), halting at a member
    not ready; whether every one was ready again. ``name`` starts each row's detail."""
    for k, i in enumerate(order, 1):
        m = nem.members[i]
        what = f"{_leader_word(nem, i)}{name}: {k} of {len(order)}"
        await nem.stop(m, what)
        nem.restart(m, name, after="stop")
        if not await nem.restarted([m], READY_WAIT):
            rest = ", ".join(nem.members[j].name for j in order[k:]) or "none"
            nem.say(f"{name} halted: {m.name} not ready (not restarted: {rest})")
            return False
    return True
