"""The cluster state machine finds planted bugs: one or more for each kind of fault.

Each planted bug is a small subclass of the real thing, put in through the machine's
hooks (``replica_class``, ``stream_class``, ``upstream_class``, ``consumer_class``,
``coordinator_class``, ``definite_failures``, ``incarnations_in_origins``). The runs
are derandomized: each finds its bug at the same example every time (most within a
few dozen examples, the slowest within a few hundred). The unplanted machine passes
(``test_cluster_machine``).
"""

from __future__ import annotations

from typing import Any

import pytest
from cluster_machine import ClusterMachine
from cluster_world import bursts, picks
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import precondition, rule, run_state_machine_as_test
from pysyncobj import FAIL_REASON

from cluster import link
from cluster.cache_sync import CacheSync, capture_sync
from cluster.coordination import CommittedBatch, Coordinator
from cluster.link_sync import SyncFrames
from cluster.raft import DEFINITE_FAILURES, CoordinationConsumer
from cluster.replica import Offer, Replica
from cluster.stream import CommittedStream
from cluster.upstream import UpstreamReplication
from migratory.model.message import Message

# --- the committed log and the replica ---------------------------------------------


class SkippingReplica(Replica):
    """Takes batch 2 as applied without applying it."""

    def offer(self, batch: CommittedBatch, now: float) -> Offer:
        if batch.clsn == 2 and self.applied_clsn == 1 and not self.needs_sync:
            self._applied_clsn = 2
            return Offer.APPLIED
        return super().offer(batch, now)


class SeqReusingCoordinator(Coordinator):
    """Every message of a subject after its second gets seq 2 again."""

    def _number(self, epoch_candidate: int, *args: Any) -> Message:
        numbered = super()._number(epoch_candidate, *args)
        if numbered.seq > 2:
            self.seqs[numbered.subject] = 2
            return numbered.with_position(numbered.epoch, 2)
        return numbered


class OriginUnorderedCoordinator(Coordinator):
    """Numbers a member's publishes in the order they commit, as before
    ``in_origin_order``: an overtaken forward after the newer ones."""

    def in_origin_order(self, items: Any, keys: Any) -> Any:
        return list(items)


# --- a sync from a peer that is behind ---------------------------------------------


class OlderSyncReplica(Replica):
    """Installs a cache sync older than what it applied (the failover crash's cause)."""

    def install_sync(self, sync: CacheSync, now: float) -> bool:
        self._applied_clsn = min(self._applied_clsn, sync.clsn)
        return super().install_sync(sync, now)


# --- a seed asked for a sync while it needs one ------------------------------------


class NeedySyncStream(CommittedStream):
    """Gives its caches when asked even while it needs a sync itself."""

    def sync_for(self, min_clsn: int) -> SyncFrames | link.SyncRefused:
        replica = self.replica
        if replica.applied_clsn < min_clsn:
            return link.SyncRefused(replica.applied_clsn, "behind")
        return SyncFrames(capture_sync(replica.hub, replica.applied_clsn))


class EmptySyncStream(CommittedStream):
    """Answers a sync request from where it stands, even behind what was asked (a seed
    at clsn 0 gives an empty sync)."""

    def sync_for(self, min_clsn: int) -> SyncFrames | link.SyncRefused:
        return super().sync_for(0)


# --- loss of the seed majority and its return --------------------------------------

UNKNOWN_AS_DEFINITE = DEFINITE_FAILURES | {
    FAIL_REASON.NOT_LEADER,
    FAIL_REASON.LEADER_CHANGED,
    FAIL_REASON.UNKNOWN_OUTCOME,
}
"""Takes Raft's "the leader changed" for "never committed"."""


# --- a non-seed switching upstream mid-stream --------------------------------------


class ResendingStream(CommittedStream):
    """Catches a (re)joining follower up from one batch before what it holds."""

    def follow(self, name: str, from_clsn: int, full: bool, queue: Any) -> None:
        super().follow(name, max(0, from_clsn - 1), full, queue)


class AskingAheadUpstream(UpstreamReplication):
    """Switching to another seed, asks it for the batches after the one after what it
    applied."""

    def start_link(self, seed: str, now: float) -> link.Replicate:
        replicate = super().start_link(seed, now)
        if not self.switches:
            return replicate
        return link.Replicate(replicate.from_clsn + 1, replicate.full)


# --- a seed restarted from a Raft dump ---------------------------------------------


class CachelessConsumer(CoordinationConsumer):
    """Dumps the numbering without the caches."""

    def _serialize(self) -> dict[str, Any]:
        state: dict[str, Any] = super()._serialize()
        del state["cache"]
        return state


class EverySeedFromACachelessDump(ClusterMachine):
    """Every seed compacts, then every seed dies; they restart from their dumps."""

    consumer_class = CachelessConsumer
    crash = raft_sends_dump = lose_majority = None  # no other restart, no other dump

    @precondition(lambda self: self.raft.quorum and not self.majority_lost)
    @rule(pick=picks, burst=bursts)
    def lose_every_seed(self, pick: int, burst: Any) -> None:
        ClusterMachine.lose_majority(self, pick, burst, 0, FAIL_REASON.LEADER_CHANGED, True)


def planted(name: str, *, without: tuple[str, ...] = (), **hooks: Any) -> type[ClusterMachine]:
    """The machine with a planted bug; ``without``: rules taken out, so that the rule
    under test is the only way to the bug."""
    return type(name, (ClusterMachine,), {**hooks, **dict.fromkeys(without)})


NO_OTHER_UNKNOWNS = ("leader_change", "submit")  # lose_majority is left to make them
NO_OTHER_RESTARTS = ("crash",)  # lose_majority is left to restart seeds
NO_OTHER_SWITCHES = ("crash", "lose_majority", "partition", "time_passes", "offer_stale_sync")
NO_SLOW_FOLLOWERS = 10**6  # no link dropped for a full queue either

PLANTED = [
    (planted("Skipping", replica_class=SkippingReplica),
     "differs from the committed log|is not what the committed log holds"),
    (planted("SeqReusing", coordinator_class=SeqReusingCoordinator), "names two messages"),
    # switch_upstream + forwards_overtaken
    (planted("OriginUnordered", coordinator_class=OriginUnorderedCoordinator), "reordered"),
    # offer_stale_sync
    (planted("OlderSync", replica_class=OlderSyncReplica), "older than|old sync|moved back"),
    # seed_batches_late + seed_asks_for_sync
    (planted("NeedySync", stream_class=NeedySyncStream), "needs a sync gave one"),
    (planted("EmptySync", stream_class=EmptySyncStream), "answers a request for clsn"),
    # lose_majority (and restart)
    (planted("UnknownAsDefinite", definite_failures=UNKNOWN_AS_DEFINITE,
             without=NO_OTHER_UNKNOWNS), "after PUBLISH_FAILED"),
    (planted("NoIncarnation", incarnations_in_origins=False,
             without=NO_OTHER_UNKNOWNS + NO_OTHER_RESTARTS), "false PUBLISH_OK"),
    # switch_upstream
    (planted("Resending", stream_class=ResendingStream, without=NO_OTHER_SWITCHES,
             follower_queue=NO_SLOW_FOLLOWERS), "again"),
    (planted("AskingAhead", upstream_class=AskingAheadUpstream, without=NO_OTHER_SWITCHES,
             follower_queue=NO_SLOW_FOLLOWERS), "a hole|did not catch up"),
    # compact + restart / raft_sends_dump (every seed: lose_majority)
    (planted("CachelessDump", consumer_class=CachelessConsumer),
     "differs from the committed log|is not what the committed log holds"),
    (EverySeedFromACachelessDump,
     "differs from the committed log|is not what the committed log holds"),
]

SETTINGS = settings(
    max_examples=1000,  # each is found well before (it stops there)
    stateful_step_count=50,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
    report_multiple_bugs=False,
)


@pytest.mark.parametrize(("machine", "complaint"), PLANTED, ids=[m.__name__ for m, _ in PLANTED])
def test_the_machine_finds_a_planted_bug(machine: type[ClusterMachine], complaint: str) -> None:
    with pytest.raises(AssertionError, match=complaint):
        run_state_machine_as_test(machine, settings=SETTINGS)
