"""Two faults at once, for tests/deploy/cluster_faults.py (its SCENARIOS; run as
``cluster_faults.py SCENARIO``):

``whole-crash-loop``
    every pod deleted at once, recreated at once (Parallel), and deleted again at once
    as soon as the first of them has started, none of them ready yet (the whole set in
    a crash loop: a bad node pool, an operator's second ``rollout restart``), the Raft
    leader's volume lost with it the second time (before any pod was ready again, so
    before any seed knew of a new leader), then recreated and left to become ready; the
    subscribers reach the pods through the client Service only.
``leader-away-seed-starting-scale-in``
    a seed that is not the Raft leader deleted and recreated (starting, not ready), and
    while it starts the leader's pod deleted and the StatefulSet scaled in from 4 to 3
    at once (non-seed 3 drains onto a cluster with one seed ready), then the leader's
    pod recreated.
"""

from __future__ import annotations

from functools import partial

import trio
from k8s_local import LocalStatefulSet
from member_status import raft_leader
from scaling_faults import SEEDS, Observed, Scenario, flowing_again


async def first_started(sts: LocalStatefulSet) -> None:
    """Back as soon as one pod's member answers its startup probe, asked every 20 ms
    (the kubelet asks every period: a loop of the play waiting for the kubelet's
    ``started`` saw all four pods ready in the same pass, one run in five)."""
    with trio.fail_after(60):
        while True:
            for pod in list(sts.pods.values()):
                if await sts.probe(pod, "startupProbe", timeout=0.5) == 200:
                    return
            await trio.sleep(0.02)


async def whole_crash_loop(sts: LocalStatefulSet, observed: Observed) -> None:
    ordinals = sorted(sts.pods)
    leader = observed["volume_lost_by"] = await raft_leader(sts)
    began = trio.current_time()
    ready_when_deleted_again: list[bool] = []
    observed["ready_when_deleted_again"] = ready_when_deleted_again
    for round_ in range(2):
        async with trio.open_nursery() as deletions:
            for ordinal in ordinals:
                deletions.start_soon(partial(  # the second time, the leader's node
                    sts.delete, ordinal, delete_volume=round_ == 1 and ordinal == leader))
        for ordinal in ordinals:
            await sts.create(ordinal)
        if round_ == 0:
            await first_started(sts)
            ready_when_deleted_again.extend(p.ready for p in sts.pods.values())
    await sts.wait_ready(ordinals, 60)
    observed["all_ready_seconds"] = round(trio.current_time() - began, 1)
    await flowing_again(observed)


async def leader_away_seed_starting_scale_in(sts: LocalStatefulSet, observed: Observed) -> None:
    """The leader's deletion begun half a second after the other seed's: its preStop
    sleep keeps it serving while that seed goes, and SIGTERM reaches it while the new
    pod of that seed starts (its startup takes longer than the half second)."""
    leader = await raft_leader(sts)
    starting = next(o for o in SEEDS if o != leader)
    observed["leader"], observed["starting"] = leader, starting

    async def restart() -> None:
        await sts.delete(starting)
        await sts.create(starting)

    async def leader_away() -> None:
        await sts.delete(leader)
        # its new pod may not be made yet (create() makes it in a thread): not ready
        pod = sts.pods.get(starting)
        observed["starting_ready_when_leader_gone"] = pod is not None and pod.ready

    began = trio.current_time()
    async with trio.open_nursery() as faults:
        faults.start_soon(restart)
        await trio.sleep(0.5)
        faults.start_soon(leader_away)
        faults.start_soon(partial(  # scaled in (kubectl scale --replicas=3, the HPA)
            sts.delete, 3, delete_volume=sts.claims_deleted_when_scaled))
    await sts.create(leader)
    await sts.wait_ready(SEEDS, 60)
    observed["all_ready_seconds"] = round(trio.current_time() - began, 1)
    observed["pods"] = sorted(sts.pods)
    await flowing_again(observed)


COMBINED_SCENARIOS: dict[str, tuple[int, Scenario]] = {  # pods at the start, the fault
    "whole-crash-loop": (4, whole_crash_loop),
    "leader-away-seed-starting-scale-in": (4, leader_away_seed_starting_scale_in),
}
COMBINED_UNAVAILABLE = {"whole-crash-loop", "leader-away-seed-starting-scale-in"}
"""Plays that leave the cluster without a Raft majority for a while."""
