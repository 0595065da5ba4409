"""The pod's memory and probes against what a member legitimately does: the budgets of
``migratory.conf`` must fit the StatefulSet's memory, and the liveness probe must outlast
the longest stop of the member's event loop that is not a fault (installing a whole
cache sync). Both are checked on the rendered install, from figures measured with the
benchmarks named below; nothing here is timed."""

from __future__ import annotations

from pathlib import Path

from k8s_manifests import documents, find, generated_secrets, load_pod_config, pod_view

import cluster.raft_compaction as compaction
from migratory.config import Config

DOCS = documents()
PASSWORD = generated_secrets("from-the-generated-secret")
MIB = 1 << 20

INSTALL_STOP_SECONDS = 5.95
"""The longest stop of a joining member's event loop (/stats ``loop_gaps``) while it
installed a whole cache sync at the 256 MiB default ``CacheMemoryBudget`` (549,535
cached 100-byte messages over 10,000 subjects; 2-core machine at load 4.6):
``benchmarks/cluster_join_sync.py --size 100 --subjects 10000 --rate 20000 --fill 35``.
The install did not yield then; the stop grew with the number of cached messages, so
with the budget. A sync from a peer is now installed a slice at a time
(cluster/cache_sync.py ``SyncInstall``: the same benchmark's joiner stopped 0.14 s at
most, at load 8-10), but a seed restored from a Raft dump
still installs the dump's caches at once: the window stays sized from this figure."""
INSTALL_BUDGET = 256 * MIB
STOP_MARGIN = 10
"""A real node may be slower, throttled or busier than the measuring machine."""

BASELINE = 64 * MIB
"""An idle member's RSS (interpreter, modules, listeners): ~46-60 MB measured."""
SUBJECT_BYTES = 1400
"""A subject's own state beside its cached messages: ~1.3 KB in a hub (MaxSubjects,
docs/config.md; tracemalloc of 100,000 retained subjects), and a seed's Raft state has
a record per subject too (~60 B beyond its budget: benchmarks/cache_memory.py --cache
replicated --budget 268435456 --subjects 1000000, +313 MiB)."""


def container() -> dict:
    (found,) = find(DOCS, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    return found


def seed_config(tmp_path: Path) -> Config:
    return load_pod_config(pod_view(DOCS, 0, PASSWORD), tmp_path / "0")


def quantity(value: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    for suffix, factor in units.items():
        if value.endswith(suffix):
            return int(value[: -len(suffix)]) * factor
    return int(value)


def test_liveness_outlasts_the_install_of_a_whole_cache_sync(tmp_path: Path) -> None:
    """A kubelet restarts a member after ``failureThreshold`` probes in a row got no
    answer within ``timeoutSeconds``: a loop stopped for longer than that window by an
    install gets the pod restarted, to sync and install again -- a crash loop."""
    probe = container()["livenessProbe"]
    window = probe["periodSeconds"] * (probe["failureThreshold"] - 1) + probe["timeoutSeconds"]
    stop = INSTALL_STOP_SECONDS * seed_config(tmp_path).cache_memory_budget / INSTALL_BUDGET
    assert window >= STOP_MARGIN * stop, (window, stop)


LOG_MEMORY_PER_BYTE = 1.31
"""A seed's memory per byte of its Raft log's entries: pysyncobj's journal keeps every
entry in memory too until a compaction (RSS +62 MiB for +47.5 MiB of journal records,
10,000 acknowledged 100-byte publishes a second to one subject, the caches at 1,000
messages: benchmarks/raft_log_memory.py --rate 10000 --chunks 4 --chunk 10)."""


def raft_log_memory(config: Config) -> float:
    """The most a seed's Raft log holds in memory: ClusterLogCompactionBytes times the
    seed's stagger, times MAX_LOG_FACTOR while a leader waits to compact for a dump on
    its way to a follower (a seed rejoining under load, every rolling update)."""
    most = (config.cluster_log_compaction_bytes * (1 + compaction.STAGGER)
            * compaction.MAX_LOG_FACTOR)
    return LOG_MEMORY_PER_BYTE * most


def test_the_memory_limit_holds_every_budget_of_a_seed(tmp_path: Path) -> None:
    """A seed at its bounds: its own cache and its Raft state's (each within
    CacheMemoryBudget; benchmarks/cache_memory.py: +256 and +251 MiB at 10,000 subjects),
    a copy of the Raft state's while the forked dump writer walks it (it touches every
    object's reference count, so every page is copied), its Raft log (in memory until
    compacted: ClusterLogCompactionBytes), the clients' outboxes, the incomplete frames,
    and the subjects themselves (every member holds every subject, as many as a
    publisher invents, up to MaxSubjects). The three seeds hold the same state and
    compact within a minute or two of each other (thresholds staggered by up to 1.5x):
    over the limit, all three are OOM-killed one after another. The log was left out
    before, and bounded by nothing but ClusterLogCompactionTime: ~1 GB at the cluster's
    ceiling, with the 2 GiB limit already holding 1,942 MiB of budgets."""
    config = seed_config(tmp_path)
    resources = container()["resources"]
    need = (
        BASELINE + 3 * config.cache_memory_budget + config.outbox_memory_budget
        + config.incomplete_frame_budget + SUBJECT_BYTES * config.max_subjects
        + raft_log_memory(config)
    )
    assert config.cache_memory_budget and config.outbox_memory_budget  # bounded at all
    assert config.max_subjects
    assert quantity(resources["limits"]["memory"]) >= need, need / MIB


def test_memory_is_requested_as_much_as_the_limit() -> None:
    """A member uses what its budgets allow (a seed ~580 MB with full caches, before any
    client): with less requested, the scheduler places it where that memory is not, and
    under node pressure the kubelet evicts first the pods above their request -- the
    seeds."""
    resources = container()["resources"]
    assert quantity(resources["requests"]["memory"]) == quantity(resources["limits"]["memory"])


JOURNAL_BYTES_PER_SECOND = 163 * MIB / 35
"""A seed's Raft journal grew 163 MiB in 35 s of 20,000 acknowledged 100-byte publishes a
second (the cluster's ceiling on the measuring machine), with no compaction yet
(benchmarks/cluster_join_sync.py --size 100 --subjects 10000 --rate 20000 --fill 35:
raft.journal of each seed's data directory)."""
JOURNAL_MARGIN = 4
"""Publishes larger than 100 bytes: four times the bytes at the same rate."""
DUMP_PER_CACHE_BYTE = 70 / 256
"""A dump (pickled, gzip) of a Raft state's cache at its 256 MiB budget: 70 MiB
(1,000,000 random 100-byte messages over 10,000 subjects, pickle.dump into gzip)."""
FILESYSTEM_SHARE = 0.95
"""ext4 keeps 5 % for root; the member is not root."""


def test_the_volume_holds_the_raft_log_between_two_compactions(tmp_path: Path) -> None:
    """A seed compacts its log every ``ClusterLogCompactionTime`` times its stagger
    (up to 1.5), and a leader waits up to ``MAX_WAIT_SECONDS`` more while a follower
    takes its dump; until then the journal grows with every publish, beside the last
    dump and the one being written. A full volume stops the seed (``No space left on
    device``), and the three seeds hold the same log: they fill up together."""
    config = seed_config(tmp_path)
    window = (
        config.cluster_log_compaction_time * (1 + compaction.STAGGER)
        + compaction.MAX_WAIT_SECONDS
    )
    need = (
        JOURNAL_MARGIN * JOURNAL_BYTES_PER_SECOND * window
        + 2 * DUMP_PER_CACHE_BYTE * config.cache_memory_budget
    ) / FILESYSTEM_SHARE
    (claim,) = find(DOCS, "StatefulSet")["spec"]["volumeClaimTemplates"]
    volume = quantity(claim["spec"]["resources"]["requests"]["storage"])
    assert volume >= need, (volume / MIB, need / MIB)
