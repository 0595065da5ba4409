"""The StatefulSet's replica count moved in ways the HPA alone never moves it, for
tests/deploy/cluster_faults.py (its SCENARIOS; run as ``cluster_faults.py SCENARIO``):

``scale-out-in-leader-restart``
    ``kubectl scale`` 3 -> 7 -> 3 while the Raft leader's pod is deleted and recreated,
    once during each step.
``scaled-below-the-seeds``
    the count set below the three seeds and back: to 1 (an apply that drops a
    ``replicas`` field the last apply had: the API's default, README "Scaling"), raised
    to 3 again (the HPA's next sync: ``minReplicas``); then to 0 (an operator stopping
    the cluster with ``kubectl scale --replicas=0``, which also stops the HPA) and to 3
    again. What the controller does with the claims of the pods it removes is the
    manifest's ``persistentVolumeClaimRetentionPolicy.whenScaled``
    (``LocalStatefulSet.scale``): the seeds' volumes hold the Raft log, so the cluster
    must come back with every position its subscribers hold.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
from k8s_local import LocalStatefulSet
from member_status import current_leader, raft_leader
from rehearsal import ACKNOWLEDGED_AT_LEAST, Load, flowing

Observed = dict[str, object]
Scenario = Callable[[LocalStatefulSet, Observed], Awaitable[None]]
SEEDS = (0, 1, 2)


async def flowing_again(observed: Observed) -> None:
    """Until the play's publishers have publishes acknowledged again (rehearsal.flowing),
    and the play as many as its check asks for: the cluster serves once more, what a play
    waits for once its fault is over (a fixed 1-2 s before). Its seconds go to
    ``observed["flowed_again_seconds"]``."""
    load = observed["_load"]
    assert isinstance(load, Load)
    waits = observed.setdefault("flowed_again_seconds", [])
    assert isinstance(waits, list)
    waits.append(round(await flowing(load, acknowledged=ACKNOWLEDGED_AT_LEAST), 2))


HPA_SYNC = 15.0
"""Seconds between two syncs of the HPA controller (kube-controller-manager's
``--horizontal-pod-autoscaler-sync-period``): how long a StatefulSet set below
``minReplicas`` stays there at most."""


async def scale_out_in_leader_restart(sts: LocalStatefulSet, observed: Observed) -> None:
    """Parallel: the controller creates, then deletes, the four non-seeds at once (their
    claims as the manifest says) while the Raft leader's pod is deleted and recreated
    each time: the joining members sync their caches, and the leaving ones drain their
    clients, onto a cluster electing a new leader."""
    restarted: list[int] = []
    observed["restarted_seeds"] = restarted

    async def leader_restart() -> None:
        leader = None
        with trio.move_on_after(10):  # (an election, or seed 0 just restarted itself)
            while (leader := await current_leader(sts)) is None:
                await trio.sleep(0.1)
        if leader is None:
            leader = await raft_leader(sts)
        restarted.append(leader)
        await sts.delete(leader)
        await sts.create(leader)

    for replicas, timeout in ((7, 90), (3, 60)):
        began = trio.current_time()
        async with trio.open_nursery() as faults:
            faults.start_soon(leader_restart)
            faults.start_soon(sts.scale, replicas)
        await sts.wait_ready(range(replicas), timeout)
        observed[f"scaled_to_{replicas}_seconds"] = round(trio.current_time() - began, 1)
        await flowing_again(observed)


async def scaled_below_the_seeds(sts: LocalStatefulSet, observed: Observed) -> None:
    for low, wait in ((1, HPA_SYNC * sts.time_scale), (0, 2.0)):
        began = trio.current_time()
        await sts.scale(low)
        await trio.sleep(wait)
        await sts.scale(len(SEEDS))
        await sts.wait_ready(SEEDS, 60)
        observed[f"back_from_{low}_seconds"] = round(trio.current_time() - began, 1)
        await flowing_again(observed)


SCALING_SCENARIOS: dict[str, tuple[int, Scenario]] = {  # pods at the start, the fault
    "scale-out-in-leader-restart": (3, scale_out_in_leader_restart),
    "scaled-below-the-seeds": (3, scaled_below_the_seeds),
}
LEADER_PINNED = {"scale-out-in-leader-restart"}
"""Plays whose first subscriber connects to the Raft leader's pod (again after each move,
k8s_local.LEADER_PORT), the member they restart: through the Service alone, all four
were on the other seeds about one run in 16 (66 runs looped under load: 4), and the play's
``subscribers_moved >= 1`` had no move to check."""
SCALING_UNAVAILABLE = {"scaled-below-the-seeds"}
"""Plays that leave the cluster without a Raft majority for a while (a publish in flight
then may have no answer)."""
