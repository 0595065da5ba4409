"""Seed coordination: a seed member's Raft node and what it submits to it.

A seed runs pysyncobj (:mod:`cluster.raft`), built off the event loop (loading a long
journal takes time). It submits its own clients' publishes and those non-seeds
forward to it, a batch per Raft command; the outcome comes from the committed stream
(acknowledgements) or from Raft's refusal (``PUBLISH_FAILED`` / ``ForwardFailed``).
When Raft cannot say whether a command committed (its leader died with it in
flight), a barrier settles it (:mod:`cluster.raft_outcomes`).

Committed batches and dumps cross from the Raft thread with ``run_sync_soon``, in
order. A seed restored from a dump gets the caches from the dump itself
(:mod:`cluster.replicated_cache`); a seed whose stream still has a gap (which the
dump makes rare) copies a peer seed's caches, never one older than its own.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

import trio

from cluster import link, raft_data_dir, raft_slow_disk
from cluster.agreement import MemberSettings
from cluster.cache_sync import CacheSync, SyncInstall
from cluster.commit_window import MAX_COMMAND_BYTES, CommitWindow
from cluster.coordination import CommittedBatch, PublishRequest
from cluster.forwarding import Outgoing
from cluster.link_io import CONNECT_ERRORS, ClusterTls, LinkChannel, connect
from cluster.raft import RaftCoordination, RaftStatus, RaftTimings, journal_files
from cluster.raft_forward import hold_deadline
from cluster.raft_outcomes import STARTING_NAME, Origins, barrier_committed, raft_failed
from cluster.raft_votes import MARKER_SUFFIX
from cluster.replica import Offer
from cluster.replicated_cache import DumpRecords
from cluster.seed_readiness import SeedReadiness
from cluster.stream import CommittedStream
from migratory.config import Config
from migratory.model.position import new_epoch
from migratory.server.metric_buckets import LATENCY_BOUNDS, Buckets

log = logging.getLogger("migratory.cluster")

RETRY_SECONDS = 0.3
MAX_HEARTBEATS_BEFORE_SYNC = 40
"""Heartbeats a seed skips waiting for the sync it asked a peer seed for (its link
writer sends one every 0.25 s until the answer is queued: 10 s of them)."""
MAX_BARRIER_ATTEMPTS = 20
SYNC_SILENCE = 10.0
"""Seconds a seed waits for a peer seed to connect, or for a byte of the sync it asked."""

RAFT_STOPPED_POLL = 0.1
"""Seconds between two looks at whether the Raft node stopped (its disk is full)."""
DUMP_DECODED_POLL = 0.01
"""Seconds between two looks at whether a Raft dump's caches have decoded (off the Raft
thread, cluster/dump_decoder.py) before their install begins."""

T = TypeVar("T")


class SeedCoordination:
    def __init__(
        self,
        *,
        config: Config,
        name: str,
        stream: CommittedStream,
        outgoing: Outgoing,
        settings: MemberSettings | None = None,
        leave: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """``settings``: this member's, compared with the seed a sync comes from;
        ``leave(reason)``: what the member does once its Raft node stopped, before it
        exits (cluster/node.py: its clients' publishes through another seed, a drain)."""
        self.leave = leave
        assert config.cluster_member_listen is not None
        self.config = config
        self.settings = settings
        self.tls = ClusterTls.from_config(config)
        self.name = name
        self.stream = stream
        self.outgoing = outgoing
        self.epoch_candidate = new_epoch()
        self.raft: RaftCoordination | None = None
        self.window = CommitWindow()
        self.commands = 0  # Raft commands of this seed's own publishes
        self.commanded_publishes = 0  # the publishes they carried
        self.forwarded_publishes = 0  # non-seeds' publishes taken (the server's activity)
        self.commit_latency = Buckets(LATENCY_BOUNDS)  # own commands: submit -> commit
        self.syncing = False
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._handed: deque[float] = deque()  # batches handed over, not yet taken: since
        self._readiness = SeedReadiness(self._handed, link_wait=config.cluster_seed_link_wait)

    # --- running ----------------------------------------------------------------------

    async def check_data_dir(self) -> None:
        """Raises OSError naming ClusterDataDir when it cannot hold the Raft log or holds
        a damaged one (:mod:`cluster.raft_data_dir`; checked again when Raft opens it):
        at start-up, before Raft waits for the seeds (:mod:`cluster.agreement_probe`), so
        such a directory still stops the member at once."""

        def check() -> None:
            files = journal_files(Path(self.config.cluster_data_dir))
            journal = files["journalFile"]
            raft_data_dir.check(journal, files["fullDumpFile"], journal + MARKER_SUFFIX)

        await trio.to_thread.run_sync(check)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                self.raft = await trio.to_thread.run_sync(self._build_raft)
                log.info("Raft node %s started", self.raft.address)
                with trio.CancelScope() as submitting:
                    nursery.start_soon(self._exit_when_raft_stops, submitting)
                    while True:
                        await self.outgoing.wait()
                        slot = await self.window.acquire()  # full: they share a command
                        requests = await self.outgoing.next_requests(0, MAX_COMMAND_BYTES)
                        self.commands += 1
                        self.commanded_publishes += len(requests)
                        self._submit(requests, reply_to=None, slot=slot)
                await trio.sleep_forever()  # (the member leaves: _exit_when_raft_stops)
            finally:
                # the task group is ending: what the Raft thread hands over from now on
                # (a barrier's answer, a gap, a dump) starts nothing in it -- a start_soon
                # into it once closed, in a run_sync_soon callback, ends trio itself
                self._nursery = None
                if self.raft is not None:
                    with trio.CancelScope(shield=True):
                        await trio.to_thread.run_sync(self.raft.close)

    async def _exit_when_raft_stops(self, submitting: trio.CancelScope | None = None) -> None:
        """A Raft node that cannot write its files stops (cluster/raft_disk.py); so does
        the member, with the reason (``migratory: Raft stopped: ...``, exit 1), once it
        has left (``leave``); ``submitting``: this seed's submits, ended first."""
        while True:
            await trio.sleep(RAFT_STOPPED_POLL)
            status = self.raft_status
            if status is not None and status.stopped is not None:
                if submitting is not None:
                    submitting.cancel()  # its publishes go elsewhere (leave)
                if self.leave is not None:
                    await self.leave(status.stopped)
                raise OSError(errno.EIO, f"Raft stopped: {status.stopped}")

    def _build_raft(self) -> RaftCoordination:
        config = self.config
        assert config.cluster_member_listen is not None
        return RaftCoordination(
            self_address=config.cluster_member_listen,
            bind_address=config.cluster_bind,
            seed_addresses=config.seed_members,
            password=config.cluster_password,
            on_commit=self._from_raft_thread(self._committed, self._handed),
            on_restore=self._from_raft_thread(self._restored),
            data_dir=Path(config.cluster_data_dir),
            max_cached_messages=config.max_cached_messages_per_subject,
            cache_budget=config.cache_memory_budget,
            timings=RaftTimings.for_election_timeout(
                config.cluster_election_timeout,
                compaction_entries=config.cluster_log_compaction_entries,
                compaction_seconds=config.cluster_log_compaction_time,
                compaction_bytes=config.cluster_log_compaction_bytes,
                link_wait=float(config.cluster_seed_link_wait),
            ),
        )

    def _from_raft_thread(
        self, handler: Callable[[T], None], handed: deque[float] | None = None
    ) -> Callable[[T], None]:
        """``handler`` run on the trio thread, in the order the Raft thread calls it;
        ``handed``: when each item still on its way was handed over (readiness)."""
        token = self._token
        assert token is not None

        def take(item: T) -> None:
            if handed:
                handed.popleft()
            if self._nursery is not None:  # (else stopping: what is left of a replay)
                handler(item)

        def hand_over(item: T) -> None:
            if handed is not None:
                handed.append(time.monotonic())
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(take, item)

        return hand_over

    # --- the committed stream -----------------------------------------------------------

    def _committed(self, batch: CommittedBatch) -> None:
        offer = self.stream.on_committed(batch, trio.current_time())
        if offer is Offer.GAP and self.stream.replica.installing is None:
            self._sync_if_needed()  # (held behind a dump being installed: not a gap)

    def _sync_if_needed(self) -> None:
        if self.stream.replica.needs_sync and not self.syncing and self._nursery is not None:
            self.syncing = True
            self._nursery.start_soon(self._sync_from_a_peer_seed)

    def _restored(self, sync: CacheSync) -> None:
        """Raft loaded a dump: its install is begun here, in the order the Raft thread
        handed it over, so the batches after it are held back behind it; it is installed
        a slice at a time (the default CacheMemoryBudget's ~660,000 messages at once
        stopped the seed's loop ~1 s: docs/benchmarks.md)."""
        install = self.stream.replica.begin_install(sync)
        if install is not None and self._nursery is not None:
            self._nursery.start_soon(self._install_dump, install)

    async def _install_dump(self, install: SyncInstall) -> None:
        records = install.subjects  # (read once decoded: a read would wait for them)
        while isinstance(records, DumpRecords) and not records.ready():
            await trio.sleep(DUMP_DECODED_POLL)
        try:
            if await self.stream.finish_install(install):
                log.info("caches restored from the Raft dump at clsn %d (%d subjects, %d "
                         "slices)", install.clsn, len(install.subjects), install.slices)
        except Exception:  # a dump the hub refuses: a bug; a peer seed's caches instead
            log.exception("the Raft dump at clsn %d could not be installed", install.clsn)
        self._sync_if_needed()  # batches held behind it that do not follow it

    def commit_statistics(self) -> dict[str, int]:
        """How this seed's own publishes were grouped into Raft commands."""
        return {
            "commands": self.commands,
            "publishes": self.commanded_publishes,
            "in_flight": self.window.in_flight,
            "window": self.window.size,
            "slots_reclaimed": self.window.reclaimed,
        }

    # --- status and readiness ------------------------------------------------------------

    @property
    def activity(self) -> int:
        """Grows with the work this seed takes in before its hub sees it: publishes
        non-seeds forwarded, and the entries its Raft node took (a follower's from the
        leader, a leader's commands), though their commits come late."""
        status = self.raft_status
        return self.forwarded_publishes + (0 if status is None else status.entries_taken)

    @property
    def raft_status(self) -> RaftStatus | None:
        return None if self.raft is None else self.raft.snapshot

    def not_ready_reason(self) -> str | None:
        return self._readiness.reason(self.raft_status, raft_slow_disk.SYNCS.statistics())

    # --- submitting -------------------------------------------------------------------

    def take_forward(self, peer: str, requests: Sequence[PublishRequest]) -> trio.Event | None:
        """A non-seed's publishes; failures go back to it as ``ForwardFailed``, but those
        this seed's Raft node never took end its link (cluster/raft_outcomes.py). Returns
        the event set once Raft answered their command (None: answered already): the
        link reads no more forwards while too many bytes of them wait (cluster/peers.py)."""
        self.forwarded_publishes += len(requests)
        if self.raft is None:  # never submitted: the non-seed forwards them elsewhere
            origins = [(r.origin, r.ref) for r in requests]
            raft_failed(self.stream, origins, STARTING_NAME, unknown=False, reply_to=peer,
                        now=trio.current_time())
            return None
        settled = trio.Event()
        self._submit(list(requests), reply_to=peer, slot=None, settled=settled)
        return settled

    def _submit(
        self,
        requests: list[PublishRequest],
        reply_to: str | None,
        slot: int | None,
        settled: trio.Event | None = None,
    ) -> None:
        """One Raft command; ``slot`` (this seed's own publishes) is given back to the
        commit window when Raft answers, and ``settled`` set."""
        assert self.raft is not None
        origins = [(r.origin, r.ref) for r in requests]
        token = self._token
        assert token is not None
        window = self.window
        submitted = time.monotonic()

        def done(clsn: int | None, error: str | None, unknown: bool) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                if settled is not None:
                    token.run_sync_soon(settled.set)
                if slot is not None:
                    token.run_sync_soon(window.release, slot)
                    if error is None:
                        elapsed = time.monotonic() - submitted
                        token.run_sync_soon(self.commit_latency.observe, elapsed)
                if error is not None:  # success is acknowledged from the committed stream
                    token.run_sync_soon(self._submit_failed, origins, error, unknown, reply_to)

        self.raft.submit(
            self.epoch_candidate, requests, done, send_by=self._send_by(origins, reply_to)
        )

    def _send_by(self, origins: Origins, reply_to: str | None) -> float:
        """The ``time.monotonic`` after which the command, if held for want of a link to
        the leader, is never sent: before its publishes time out (cluster/raft_forward.py)."""
        publishing = self.stream.publishing
        now = trio.current_time()
        deadline = hold_deadline(
            now=now,
            oldest_submitted=None if reply_to else publishing.oldest_submitted(origins),
            publish_timeout=publishing.publish_timeout,
            forwarded=reply_to is not None,
        )
        return time.monotonic() + (deadline - now)

    def _submit_failed(
        self, origins: Origins, error: str, unknown: bool, reply_to: str | None
    ) -> None:
        now = trio.current_time()
        if raft_failed(self.stream, origins, error, unknown=unknown, reply_to=reply_to, now=now):
            self._submit_barrier(origins, error, reply_to, attempt=1)

    def _submit_barrier(
        self, origins: Origins, error: str, reply_to: str | None, attempt: int
    ) -> None:
        assert self.raft is not None and self._token is not None
        token = self._token

        def done(clsn: int | None, barrier_error: str | None, unknown: bool) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(
                    self._barrier_done, origins, error, reply_to, barrier_error, attempt
                )

        self.raft.submit(self.epoch_candidate, [], done)

    def _barrier_done(
        self,
        origins: Origins,
        error: str,
        reply_to: str | None,
        barrier_error: str | None,
        attempt: int,
    ) -> None:
        if barrier_error is None:
            barrier_committed(
                self.stream, origins, error, reply_to=reply_to, now=trio.current_time()
            )
        elif attempt < MAX_BARRIER_ATTEMPTS and self._nursery is not None:
            self._nursery.start_soon(self._retry_barrier, origins, error, reply_to, attempt)
        # else: the publish timeout reports the outcome as unknown

    async def _retry_barrier(
        self, origins: Origins, error: str, reply_to: str | None, attempt: int
    ) -> None:
        await trio.sleep(RETRY_SECONDS / 3)
        self._submit_barrier(origins, error, reply_to, attempt + 1)

    # --- a gap: a peer seed's caches ----------------------------------------------------

    async def _sync_from_a_peer_seed(self) -> None:
        """Copy a peer seed's caches, as of at least the batch this seed needs."""
        replica = self.stream.replica
        others = [a for a in self.config.seed_members if a != self.config.cluster_member_listen]
        try:
            while replica.needs_sync:
                for address in random.sample(others, len(others)):
                    try:
                        await self._sync_from(address)
                    except Exception:  # one attempt with one peer, never the member
                        log.exception("cache sync from %s:%d failed", *address)
                    if not replica.needs_sync:
                        return
                await trio.sleep(RETRY_SECONDS)
        finally:
            self.syncing = False

    async def _sync_from(self, address: tuple[str, int]) -> None:
        replica = self.stream.replica
        peer = f"{address[0]}:{address[1]}"
        try:
            with trio.fail_after(SYNC_SILENCE):
                channel = await connect(
                    address, member=self.name, password=self.config.cluster_password,
                    tls=self.tls, settings=self.settings,
                    max_frame=link.connected_frame_limit(self.config.max_frame_size))
            try:
                with trio.fail_after(SYNC_SILENCE):
                    await channel.send(link.SyncRequest(replica.sync_floor))
                op = await self._answer(channel, peer)
            finally:
                await channel.aclose()
        except CONNECT_ERRORS as exc:
            log.info("cache sync from %s failed: %s", peer, exc)
            return
        except Exception:
            log.exception("cache sync from %s failed", peer)
            return
        if isinstance(op, link.Sync):
            if await self.stream.install_sync_in_slices(op.sync):
                log.info("cache synced from %s at clsn %d", peer, op.sync.clsn)
            else:
                log.info("%s offered a sync at clsn %d, behind this seed (or a Raft dump came "
                         "first); not installed", peer, op.sync.clsn)
        elif isinstance(op, link.SyncRefused):
            log.info("%s cannot give a sync now (at clsn %d): %s", peer, op.clsn, op.reason)

    @staticmethod
    async def _answer(channel: LinkChannel, peer: str) -> link.Sync | link.SyncRefused | None:
        """The peer's answer to a ``SyncRequest``, past the heartbeats its link writer
        sent before it (one every 0.25 s while it had nothing else: taking the first
        operation for the answer gave up on the peer and tried again
        :data:`RETRY_SECONDS` later); None (logged) for anything else, or once
        :data:`MAX_HEARTBEATS_BEFORE_SYNC` heartbeats came first."""
        for _ in range(MAX_HEARTBEATS_BEFORE_SYNC + 1):
            # a large sync comes in parts for longer than that: silence is no byte
            op = await channel.receive_within(SYNC_SILENCE)
            if isinstance(op, link.Sync | link.SyncRefused):
                return op
            if not isinstance(op, link.Heartbeat):
                what = "closed the link" if op is None else f"sent {type(op).__name__}"
                log.info("cache sync from %s: it %s instead", peer, what)
                return None
        log.info("cache sync from %s: %d heartbeats and no answer", peer,
                 MAX_HEARTBEATS_BEFORE_SYNC + 1)
        return None
