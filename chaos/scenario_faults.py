"""A fault of several steps, run on the nemesis: a restart of every member
(:mod:`chaos.restarts`), a combination (:mod:`chaos.combos`) or a scenario
(:mod:`chaos.scenarios`).

The runner hands :func:`run_scenario_fault` to the :class:`~chaos.nemesis.Nemesis`
it builds: the nemesis applies single faults and the scenarios are made of its steps,
so they import it and it imports none of them.
"""

from __future__ import annotations

from chaos.combos import run_combo
from chaos.nemesis import Nemesis
from chaos.restarts import run_restart
from chaos.scenarios import run_scenario
from chaos.schedule import COMBOS, RESTARTS, Fault


async def run_scenario_fault(nem: Nemesis, f: Fault, start: float) -> None:
    if f.fault in RESTARTS:
        await run_restart(nem, f, start)
    elif f.fault in COMBOS:
        await run_combo(nem, f, start)
    else:
        await run_scenario(nem, f, start)
