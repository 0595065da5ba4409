"""Upstream replication: how a non-seed follows the committed stream from one seed.

A non-seed dials one seed at a time (its *upstream*), asks to be caught up from its
own CLSN (``Replicate``), applies what comes (batches, or a whole cache sync), and
forwards its clients' publishes over the same link. It leaves that seed and dials
another when:

- the link fails in any way (reset, refused, protocol error);
- nothing arrives for :data:`UPSTREAM_SILENCE` seconds (the seed is stopped,
  SIGSTOPped or cut off -- it would otherwise send a heartbeat every 250 ms); the same
  bound holds while the link is made: each answer of its handshake must come within
  it (a stopped seed's kernel still takes the dial: the handshake's 5 s and the TLS
  question's 7 s after it held the non-seed ~12 s, its clients sent away meanwhile);
- the seed says it is not ready for :data:`UPSTREAM_NOT_READY` seconds (it lost
  the Raft majority or is replaying its log);
- the seed offers a cache sync older than what this member has applied (it is
  behind: installing it would move clients back) -- the sync is refused, never
  installed;
- the stream has a gap (then it asks the next seed for a whole sync);
- the seed has stayed ready and behind this member for :data:`UPSTREAM_BEHIND`
  seconds: a seed of its own history would have caught up (or said it is not ready:
  ``BEHIND_SECONDS``), so its seeds may have
  started a new cluster (every ``ClusterDataDir`` lost). It asks the next seed for its
  whole cache, from clsn 0: a sync that proves another history
  (:mod:`cluster.sync_history`) replaces this member's state whatever its clsn.

What it forwarded and got no answer for goes to the next seed again, first: lost with
the seed it left, it commits now; committed already, it is answered with its position
(:mod:`cluster.coordination`, ``repeats``).

Nothing that goes wrong on one link ends the member: every failure ends the link,
is logged with the seed's name, and the loop dials on.

The decisions are pure, given the time (``start_link``, ``_on_op``, ``end_link``): the
async loop only does the I/O around them, and the cluster model (``tests/cluster``)
drives them directly.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import trio

from cluster import link
from cluster.agreement import MemberSettings, Repeats
from cluster.cache_sync import CacheSync
from cluster.forwarding import SUBMIT_LINGER, Outgoing, forward_to
from cluster.link_io import (
    CONNECT_ERRORS,
    ClusterTls,
    Disagreement,
    LinkChannel,
    Unanswered,
    connect,
    describe,
)
from cluster.readiness import BEHIND_SECONDS
from cluster.replica import Offer
from cluster.stream import CommittedStream
from cluster.sync_history import another_history

log = logging.getLogger("migratory.cluster")

UPSTREAM_SILENCE = 2.0
"""Seconds a non-seed waits for a byte from its seed before it leaves it for another: on
the link (which carries a heartbeat every 250 ms, busy or idle) and for each answer of
the handshake that makes it (``connect``'s ``answer_within``). A seed at full load still
answers within it -- its event loop was held at most 0.84 s by a fan-out to 1,000
subscribers (docs/benchmarks.md, "Elections while every seed lives") --; one that cannot could not
keep the link once made either."""
UPSTREAM_NOT_READY = 2.0
UPSTREAM_BEHIND = BEHIND_SECONDS + 2.0
"""Seconds a seed may say it is ready and stay behind this member: a seed of this
member's own history that has not applied what was committed ``BEHIND_SECONDS`` ago is
not ready, and what this member applied was committed before it got it."""
RETRY_SECONDS = 0.3
ANSWER_POLLS = 10
ANSWER_POLL_SECONDS = 0.1
"""While no seed has answered the agreement probe (it asks every 0.3 s while one could
not be asked), a non-seed looks this often, this many times, before it dials one blind."""


class LeaveUpstream(Exception):
    """Leave this upstream seed (and say why)."""


@dataclass(frozen=True, slots=True)
class UpstreamView:
    """Where a non-seed stands with its upstream, for readiness and status."""

    seed: str | None = None
    heartbeat_clsn: int | None = None
    """The clsn of the seed's last heartbeat on this link (None: none yet)."""
    seed_ready: bool = False
    last_heard: float = 0.0
    """trio time of the last frame from the seed."""


def member_name(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


def pick(seeds: Sequence[tuple[str, int]], turn: int, answered: Collection[str]) -> int:
    """The index of the seed to dial at ``turn``: the next in turn that has ``answered``
    the agreement probe, or, when none has, the next in turn. A whole cluster restarted
    at once has seeds still starting -- or one that took the dial and does not answer (a
    box far busier than its cores) --: dialled first, such a seed held the non-seed for
    the handshake's time limit and the TLS question after it (~6 s,
    ``benchmarks/cluster_whole_restart.py --order stalled``) while another seed served."""
    n = len(seeds)
    for k in range(n):
        if member_name(seeds[(turn + k) % n]) in answered:
            return (turn + k) % n
    return turn % n


class UpstreamReplication:
    def __init__(
        self,
        *,
        name: str,
        seeds: Sequence[tuple[str, int]],
        password: str,
        tls: ClusterTls | None = None,
        stream: CommittedStream,
        outgoing: Outgoing,
        forward_linger: float = SUBMIT_LINGER,
        settings: MemberSettings | None = None,
        max_frame: int,
        answered: Callable[[], Collection[str]] | None = None,
    ) -> None:
        """``forward_linger``: seconds publishes wait to share one forward; ``settings``:
        this member's, compared with each seed's (:mod:`cluster.agreement`);
        ``max_frame``: the largest frame taken from a seed
        (:func:`cluster.link.connected_frame_limit` of the member's MaxFrameSize);
        ``answered``: the seeds that agreed at the agreement probe's last question to
        them (:func:`pick`; None: no probe, the seeds in turn)."""
        self.answered = answered
        self.max_frame = max_frame
        self.settings = settings
        self.refusals = Repeats()
        self.name = name
        self.forward_linger = forward_linger
        self.seeds = list(seeds)
        self.password = password
        self.tls = tls
        self.stream = stream
        self.outgoing = outgoing
        self.view = UpstreamView()
        self.switches = 0
        self._not_ready_since: float | None = None
        self._behind_since: float | None = None
        self._ask_whole = False
        """Ask the next seed for its whole cache from clsn 0 (one stayed behind here)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        seeds = list(self.seeds)
        random.shuffle(seeds)
        turn = tries = 0
        while True:
            turn = pick(seeds, turn, await self._answered()) + 1
            tries += 1
            await self._follow(seeds[turn - 1])
            if tries % len(seeds) == 0:
                await trio.sleep(RETRY_SECONDS)

    async def _answered(self) -> Collection[str]:
        """The seeds that answered the agreement probe; while none has, wait a little
        for one (a non-seed up before the seeds: its first round found none; dialled
        blind, a seed that took the dial and says nothing held it ~12 s)."""
        if self.answered is None:
            return ()
        for _ in range(ANSWER_POLLS):
            answered = self.answered()
            if answered:
                return answered
            await trio.sleep(ANSWER_POLL_SECONDS)
        return self.answered()

    async def _follow(self, address: tuple[str, int]) -> None:
        """Replicate from the seed at ``address`` until something ends it; never raises
        (but for cancellation)."""
        seed = member_name(address)
        try:
            channel = await connect(
                address, member=self.name, password=self.password, tls=self.tls,
                settings=self.settings, max_frame=self.max_frame,
                answer_within=UPSTREAM_SILENCE,
            )
        except Disagreement as exc:
            if self.refusals.first(seed, exc.reason, trio.current_time()):
                log.warning("not replicating from seed %s: %s", seed, exc.reason)
            return
        except Unanswered as exc:
            if self.refusals.first(seed, "unanswered", trio.current_time()):
                log.warning("seed %s took the dial but said nothing (%s: stopped, or too "
                            "busy to keep a link); trying another", seed, exc)
            return
        except CONNECT_ERRORS as exc:
            log.debug("seed %s unreachable: %s", seed, exc)
            return
        except Exception:
            log.exception("dialling seed %s failed", seed)
            return
        replicate = self.start_link(seed, trio.current_time())
        log.info("replicating from seed %s at clsn %d%s", seed, replicate.from_clsn,
                 " (needs a whole sync)" if replicate.full else "")
        try:
            await self._replicate(seed, channel, replicate)
        # except*: what ends the link comes out of _replicate's nursery as a group
        except* LeaveUpstream as why:
            log.warning("leaving seed %s: %s", seed, describe(why))
        except* link.LinkViolation as broke:
            log.warning("seed %s broke the link's bounds, leaving it: %s (members of one "
                        "cluster share MaxFrameSize; docs/cluster.md, Bounds)", seed,
                        describe(broke))
        except* (*CONNECT_ERRORS, trio.EndOfChannel) as lost:
            log.warning("lost seed %s: %s", seed, describe(lost))
        except* Exception:
            log.exception("replication from seed %s failed; trying another", seed)
        finally:
            self.end_link()
            await channel.aclose()

    async def _replicate(self, seed: str, channel: LinkChannel, replicate: link.Replicate) -> None:
        await channel.send(replicate)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(forward_to, channel, self.outgoing, self.forward_linger)
            while True:
                try:  # silence is no byte at all: a sync in parts is many seconds of bytes
                    op = await channel.receive_within(UPSTREAM_SILENCE)
                except trio.TooSlowError:
                    raise LeaveUpstream(f"nothing from it for {UPSTREAM_SILENCE:g} s") from None
                if op is None:
                    raise LeaveUpstream("the seed closed the link")
                if isinstance(op, link.Sync):  # later frames wait on the link meanwhile
                    self._heard(seed, trio.current_time())
                    installed = await self.stream.install_sync_in_slices(op.sync)
                    if not installed and self._another_history(seed, op.sync):
                        installed = await self.stream.install_sync_in_slices(op.sync, over=True)
                    self._synced(seed, op.sync, installed)
                else:
                    self._on_op(seed, op, trio.current_time())
            nursery.cancel_scope.cancel()

    # --- the decisions (pure, given the time) ----------------------------------------

    def start_link(self, seed: str, now: float) -> link.Replicate:
        """A link to ``seed`` is up: what to ask it for (every batch after what is
        applied here, or a whole sync while this member needs one). The publishes
        forwarded through the seed before and not answered go to it again, first
        (:meth:`~cluster.publishing.ClusterPublishing.resend_unanswered`)."""
        self.view = UpstreamView(seed=seed, last_heard=now)
        self._not_ready_since = self._behind_since = None
        resent = self.stream.publishing.resend_unanswered(now)
        if resent:
            log.info("forwarding %d unanswered publishes again, through seed %s", resent, seed)
        replica = self.stream.replica
        if self._ask_whole:
            return link.Replicate(0, full=True)
        return link.Replicate(replica.applied_clsn, full=replica.needs_sync)

    def end_link(self) -> None:
        """The link to the upstream seed is gone (for whatever reason)."""
        self.view = UpstreamView()
        self.switches += 1

    def _on_op(self, seed: str, op: link.LinkOp, now: float) -> None:
        """One operation from the upstream seed; raises :class:`LeaveUpstream` (or
        :class:`~cluster.link.LinkError`) when this member must leave it."""
        self._heard(seed, now)
        replica = self.stream.replica
        if isinstance(op, link.Batch):
            if self.stream.on_committed(op.batch, now) is Offer.GAP:
                raise LeaveUpstream(
                    f"gap in the committed stream at clsn {replica.applied_clsn} (received "
                    f"batch {op.batch.clsn}); asking for a whole sync"
                )
        elif isinstance(op, link.Sync):  # the link installs it in slices (_replicate)
            installed = self.stream.install_sync(op.sync, now)
            if not installed and self._another_history(seed, op.sync):
                installed = self.stream.install_sync(op.sync, now, over=True)
            self._synced(seed, op.sync, installed)
        elif isinstance(op, link.Heartbeat):
            self.view = UpstreamView(seed, op.clsn, op.ready, now)
            self._check_seed_ready(op.ready, now)
            self._check_seed_behind(op, now)
        elif isinstance(op, link.ForwardFailed):
            self.stream.publishing.on_failed(
                list(op.origins), op.reason, unknown=op.unknown, now=now, status=op.status
            )
        else:
            raise link.LinkError(f"unexpected {type(op).__name__} from seed {seed}")

    def _heard(self, seed: str, now: float) -> None:
        view = self.view
        self.view = UpstreamView(seed, view.heartbeat_clsn, view.seed_ready, now)

    def _another_history(self, seed: str, sync: CacheSync) -> bool:
        """Whether ``sync``, behind this member, proves another Raft history (then it
        replaces this member's state: said here)."""
        why = another_history(sync, ((s, p) for s, p, _, _ in self.stream.replica.hub.numbered()))
        if why is not None:
            log.warning(
                "seed %s's cache sync at clsn %d is of another Raft history than the %d "
                "applied here (%s): its seeds started a new cluster; installed over this "
                "member's (its subscribers resume with DATA_RESYNC)",
                seed, sync.clsn, self.stream.replica.applied_clsn, why)
        return why is not None

    def _check_seed_behind(self, heartbeat: link.Heartbeat, now: float) -> None:
        applied = self.stream.replica.applied_clsn
        if not heartbeat.ready or heartbeat.clsn >= applied:
            self._behind_since = None
        elif self._behind_since is None:
            self._behind_since = now
        elif now - self._behind_since >= UPSTREAM_BEHIND:
            self._ask_whole = True
            raise LeaveUpstream(
                f"it has been ready at clsn {heartbeat.clsn}, behind the {applied} applied "
                f"here, for {UPSTREAM_BEHIND:g} s (a new cluster's seeds?); asking for a "
                "whole cache sync")

    def _synced(self, seed: str, sync: CacheSync, installed: bool) -> None:
        if installed:
            self._ask_whole = False
        if not installed:
            raise LeaveUpstream(
                f"it offered a cache sync at clsn {sync.clsn}, behind the "
                f"{self.stream.replica.applied_clsn} applied here (refused: it would move "
                "clients back)"
            )
        log.info("cache synced from seed %s at clsn %d", seed, sync.clsn)

    def _check_seed_ready(self, ready: bool, now: float) -> None:
        if ready:
            self._not_ready_since = None
            return
        if self._not_ready_since is None:
            self._not_ready_since = now
        elif now - self._not_ready_since >= UPSTREAM_NOT_READY:
            raise LeaveUpstream(f"it has not been ready for {UPSTREAM_NOT_READY:g} s")

    def not_ready_reason(self, now: float) -> str | None:
        """Why this non-seed cannot serve clients now, or None."""
        view, replica = self.view, self.stream.replica
        if view.seed is None:
            return "member is not replicating from a seed yet"
        if view.heartbeat_clsn is None:
            return f"waiting for seed {view.seed} to catch it up"
        if not view.seed_ready:
            return f"seed {view.seed} is not ready"
        if replica.applied_clsn < view.heartbeat_clsn:
            return (
                f"catching up with seed {view.seed} "
                f"(clsn {replica.applied_clsn} of {view.heartbeat_clsn})"
            )
        silent = now - view.last_heard
        if silent > UPSTREAM_SILENCE / 2:
            return f"no word from seed {view.seed} for {silent:.1f} s"
        return None
