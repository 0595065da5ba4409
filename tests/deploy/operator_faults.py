"""What operators do, combined, for tests/deploy/cluster_faults.py (its SCENARIOS; run as
``cluster_faults.py SCENARIO``):

``roll-with-scale-in``
    a config change rolling out over 5 pods (highest ordinal first) while the HPA scales
    in to 3: pod 4's new pod is still starting when the count falls, so pods 4 and 3 are
    deleted at once (``Parallel``), one of them the rolled one; then the roll goes on
    with seed 2, which must come back ready on the new config.
``killed-mid-drain``
    the Raft leader's pod and non-seed 3 deleted at once with a grace period that ends
    0.5 s after their SIGTERM (a ``kubectl delete --grace-period`` that cuts the
    first deletion short, or a drain longer than ``terminationGracePeriodSeconds``),
    each holding a client that never answers the close: each is SIGKILLed in the
    middle of its drain, then recreated.
``node-drain-two-seeds``
    a node holding seeds 1 and 0 drained (two nodes: the hard spread puts the seeds
    2 + 1) while cluster DNS answers a recreated name with its old IP for 30 s (scaled):
    ``kubectl drain`` asks the eviction API for both at once, the PDB lets one go, and
    the other is asked for again every 5 s (scaled) until the PDB lets it go too.
``bad-config-roll``
    a ConfigMap change with a misspelt key rolled onto seed 2, the first pod of the
    roll: it must stop at start with one line naming the key (restarted once, as the
    kubelet does, the same), never be ready, while seeds 0 and 1 serve; then another
    change with a port out of range, the same; then the forced rollback (the change
    reverted, the pod deleted).
``password-rotated``
    the ClusterPassword Secret changed while the cluster runs: non-seed 3's pod
    restarted (it reads the new value) must stay not ready without disturbing the
    others; then the documented rotation: every pod stopped (``kubectl scale
    --replicas=0``), all back with the new password from their Raft logs.
"""

from __future__ import annotations

import copy

import trio
from k8s_local import CLUSTER_DNS_CACHE, LocalStatefulSet, Pod, http_body
from k8s_manifests import MONITOR_PORT, Document, find
from member_status import current_leader, raft_leader
from scaling_faults import SEEDS, Observed, Scenario, flowing_again

DRAIN_RETRY = 5.0
"""Seconds ``kubectl drain`` waits before asking again for an eviction the API refused
(429: the PDB would be broken)."""


def changed_config(docs: list[Document], old: str, new: str) -> list[Document]:
    """The install with ``old`` replaced by ``new`` in its ConfigMap's migratory.conf."""
    changed = copy.deepcopy(docs)
    volume = find(changed, "StatefulSet")["spec"]["template"]["spec"]["volumes"][0]
    config_map = find(changed, "ConfigMap", volume["configMap"]["name"])
    text = config_map["data"]["migratory.conf"]
    assert f"\n{old}\n" in text, text
    config_map["data"]["migratory.conf"] = text.replace(f"\n{old}\n", f"\n{new}\n")
    return changed


async def count_outage(sts: LocalStatefulSet, down: list[float]) -> None:
    """``down[0]``: seconds in which fewer than a majority of the seeds answered their
    readiness probe 200 within 1 s, each asked every 0.25 s (the kubelet's count takes a
    pod out only after 3 failures in a row: an outage of a few seconds would not show)."""
    answers: list[bool] = []

    async def ask(pod: Pod) -> None:
        answers.append(await sts.probe(pod, "readinessProbe", timeout=1.0) == 200)

    last = trio.current_time()
    while True:
        answers.clear()
        async with trio.open_nursery() as nursery:
            for ordinal in SEEDS:
                if ordinal in sts.pods and not sts.pods[ordinal].deleting:
                    nursery.start_soon(ask, sts.pods[ordinal])
        now = trio.current_time()
        if sum(answers) < 2:
            down[0] += now - last
        last = now
        await trio.sleep(0.25)


async def wait_started(sts: LocalStatefulSet, ordinal: int) -> None:
    with trio.fail_after(60):
        while not sts.pods[ordinal].started:
            await trio.sleep(0.05)


async def roll_with_scale_in(sts: LocalStatefulSet, observed: Observed) -> None:
    rolled = changed_config(sts.docs, "DrainTime = 45", "DrainTime = 44")
    min_ready = float(find(sts.docs, "StatefulSet")["spec"].get("minReadySeconds", 0))
    await sts.delete(4)
    sts.docs = rolled
    await sts.create(4)  # the HPA scales in while its member starts: since the stand-in's
    # kubelet probes each pod on its own (021f68b) and pods start from bytecode (5a91b0b),
    # a non-seed was ready as soon as its startup probe passed (the mid CI of 19104a4)
    observed["rolled_pod_ready_when_scaled_in"] = sts.pods[4].ready
    began = trio.current_time()
    await sts.scale(3)  # the HPA: 4 (new, starting) and 3 (old) at once
    observed["scaled_in_seconds"] = round(trio.current_time() - began, 1)
    await sts.delete(2)  # the roll goes on below the new count
    await sts.create(2)
    await sts.wait_ready(SEEDS, 60)
    await trio.sleep(min_ready * sts.time_scale)
    observed["pods"] = sorted(sts.pods)
    config = next(sts.pods[2].process.pod_dir.glob("configmap-*/migratory.conf")).read_text()
    observed["seed_2_config"] = next(
        line for line in config.splitlines() if line.startswith("DrainTime"))


async def silent_client(ip: str, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                        ) -> None:
    """A WebSocket client that never reads again once upgraded: the drain waits for its
    answer to the close (the close linger, 5 s) -- a drain still under way when the
    grace period ends."""
    stream = await trio.open_tcp_stream(ip, 8800)
    async with stream:
        await stream.send_all(
            f"GET / HTTP/1.1\r\nHost: {ip}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            .encode())
        head = await stream.receive_some(4096)
        assert head.startswith(b"HTTP/1.1 101"), head
        task_status.started()
        await trio.sleep_forever()


async def killed_mid_drain(sts: LocalStatefulSet, observed: Observed) -> None:
    pre_stop = float(sts.container["lifecycle"]["preStop"]["sleep"]["seconds"])
    grace = pre_stop * sts.time_scale + 0.5
    leader = await current_leader(sts)
    if leader is None:
        leader = await raft_leader(sts)
    observed["killed"] = [leader, 3]
    codes: dict[int, int | None] = {}
    observed["exit_codes"] = codes

    async def deleted(ordinal: int) -> None:
        codes[ordinal] = await sts.delete(ordinal, grace=grace)

    began = trio.current_time()
    async with trio.open_nursery() as deletions:
        for ordinal in (leader, 3):
            await deletions.start(silent_client, sts.pods[ordinal].ip)
        for ordinal in (leader, 3):
            deletions.start_soon(deleted, ordinal)
        with trio.move_on_after(grace + 12):  # both SIGKILLed at the grace period's end
            while len(codes) < 2:  # (a fixed grace + 2 s before)
                await trio.sleep(0.05)
        deletions.cancel_scope.cancel()  # (the silent clients)
    for ordinal in (leader, 3):
        await sts.create(ordinal)
    await sts.wait_ready(sorted(sts.pods), 60)
    observed["all_ready_seconds"] = round(trio.current_time() - began, 1)
    await flowing_again(observed)


def evictable(sts: LocalStatefulSet, ordinal: int) -> bool:
    """The eviction API's answer for ``ordinal`` under the PDB: a pod it covers goes only
    while the ready pods it covers (none being deleted) stay at ``minAvailable`` after
    (a not-ready one while they are at it). Readiness alone: the API knows nothing of
    the StatefulSet's ``minReadySeconds``."""
    pdb = find(sts.docs, "PodDisruptionBudget")["spec"]
    covered = {int(v) for v in pdb["selector"]["matchExpressions"][0]["values"]}
    if ordinal not in covered:
        return True
    healthy = sum(1 for o, p in sts.pods.items() if o in covered and p.ready and not p.deleting)
    return healthy - int(sts.pods[ordinal].ready) >= int(pdb["minAvailable"])


async def drained(sts: LocalStatefulSet, ordinal: int, refusals: dict[int, int]) -> None:
    """One pod of ``kubectl drain``: evicted once the API lets it, recreated elsewhere."""
    refusals[ordinal] = 0
    while not evictable(sts, ordinal):
        refusals[ordinal] += 1
        await trio.sleep(DRAIN_RETRY * sts.time_scale)
    sts.events.note(f"evicted {sts.pods[ordinal].name}")
    await sts.delete(ordinal)
    await sts.create(ordinal)


async def node_drain_two_seeds(sts: LocalStatefulSet, observed: Observed) -> None:
    sts.dns_cache = CLUSTER_DNS_CACHE * sts.time_scale
    down = [0.0]
    refusals: dict[int, int] = {}
    began = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(count_outage, sts, down)
        async with trio.open_nursery() as drain:
            drain.start_soon(drained, sts, 1, refusals)  # the higher one first: seed 2
            await trio.sleep(0.05)  # dials it, with the old IP in its cache
            drain.start_soon(drained, sts, 0, refusals)
        await sts.wait_ready(SEEDS, 90)
        nursery.cancel_scope.cancel()
    observed["drained_seconds"] = round(trio.current_time() - began, 1)
    observed["evictions_refused"] = refusals
    observed["seconds_without_a_ready_seed_majority"] = round(down[0], 2)
    observed["dns_cache_seconds"] = sts.dns_cache


async def crash_looping(sts: LocalStatefulSet, ordinal: int, starts: int) -> list[str]:
    """Pod ``ordinal`` created ``starts`` times, as the kubelet restarts a container that
    exits (its back-off: 10 s, scaled): each time it must exit before its startup probe
    passes; what each start wrote (the pod's log, which the pod before of its name began:
    ``kubectl logs --previous``)."""
    logs = []
    for _ in range(starts):
        pod = await sts.create(ordinal)
        pod.may_exit = True
        before = len(pod.process.log())  # (the member is still importing)
        with trio.fail_after(30):
            while pod.process.proc.poll() is None:
                assert not pod.started and not pod.ready, f"{pod.name} started"
                await trio.sleep(0.05)
        logs.append(pod.process.log()[before:])
        pod.process.stop()
        del sts.pods[ordinal]
        await trio.sleep(10 * sts.time_scale)
    return logs


async def bad_config_roll(sts: LocalStatefulSet, observed: Observed) -> None:
    before = sts.docs
    acked = len(observed_load(observed))
    await sts.delete(2)
    sts.docs = changed_config(before, "ClusterElectionTimeout = 300",
                              "ClusterElectionTimout = 300")
    crashes = await crash_looping(sts, 2, 2)
    sts.docs = changed_config(before, "Listen = 0.0.0.0:8800", "Listen = 0.0.0.0:88000")
    crashes += await crash_looping(sts, 2, 1)  # "fixed" by another bad change
    observed["crash_logs"] = crashes
    observed["others_ready"] = all(p.ready for p in sts.pods.values())
    observed["acknowledged_while_crashing"] = len(observed_load(observed)) - acked
    sts.docs = before  # the forced rollback: reverted, the pod deleted (it is: crashed)
    await sts.create(2)
    await sts.wait_ready(SEEDS, 60)
    await flowing_again(observed)


def observed_load(observed: Observed) -> dict[bytes, object]:
    load = observed["_load"]
    acked = getattr(load, "acked", None)
    assert isinstance(acked, dict)
    return acked


async def password_rotated(sts: LocalStatefulSet, observed: Observed) -> None:
    old = dict(sts.secrets)
    password = ("migratory-cluster", "password")
    sts.secrets = {**old, password: "rotated-" + old[password]}  # (the TLS Secret kept)
    await sts.delete(3)  # restarted (a node drain, an eviction): reads the new Secret
    pod = await sts.create(3)
    await wait_started(sts, 3)
    samples = []
    for _ in range(16):
        samples.append(pod.ready)
        await trio.sleep(0.5)
    reason = await http_body(pod.ip, MONITOR_PORT, "/readyz")
    with trio.move_on_after(30):  # on a busy box the seeds' refusals come later
        while "ClusterPassword" not in reason:
            samples.append(pod.ready)
            await trio.sleep(0.5)
            reason = await http_body(pod.ip, MONITOR_PORT, "/readyz")
    observed["restarted_pod_ready"] = samples
    observed["restarted_pod_readyz"] = reason
    observed["others_ready"] = all(p.ready for o, p in sts.pods.items() if o != 3)
    began = trio.current_time()
    await sts.scale(0)  # the rotation: every pod stopped, all back on the new password
    await sts.scale(4)
    await sts.wait_ready(range(4), 60)
    observed["rotated_ready_seconds"] = round(trio.current_time() - began, 1)
    await flowing_again(observed)


OPERATOR_SCENARIOS: dict[str, tuple[int, Scenario]] = {  # pods at the start, the fault
    "roll-with-scale-in": (5, roll_with_scale_in),
    "killed-mid-drain": (4, killed_mid_drain),
    "node-drain-two-seeds": (3, node_drain_two_seeds),
    "bad-config-roll": (3, bad_config_roll),
    "password-rotated": (4, password_rotated),
}
OPERATOR_PINNED = {"killed-mid-drain"}
"""Plays whose first subscriber connects to the Raft leader's pod (k8s_local.LEADER_PORT):
the pod they kill."""
OPERATOR_UNAVAILABLE = {"killed-mid-drain", "password-rotated", "node-drain-two-seeds"}
"""Plays where a publish in flight may have no answer: its member SIGKILLed, every pod
stopped, or two seeds unlinked (node-drain-two-seeds: README, "Node drains")."""
