"""A Guaranteed-mode cluster member: the trio runtime around the pure parts.

Seeds run Raft (:mod:`cluster.raft`) and apply committed batches to their
hub; they serve the committed stream to non-seeds over the cluster link.
Non-seeds replicate that stream from one seed at a time (moving to another
when it fails) and forward their clients' publishes to it. Every member
acknowledges its own clients' publishes from the committed stream
(:mod:`cluster.publishing`) and refuses new clients (close 1013) until its
cache is in sync.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import secrets
import time
from collections import deque
from pathlib import Path
from typing import Any

import trio

from cluster import link
from cluster.coordination import CommittedBatch, PublishRequest
from cluster.link_io import LinkChannel, connect
from cluster.publishing import ClusterPublishing
from cluster.raft import RaftCoordination, RaftTimings
from cluster.replica import Offer, Replica
from migratory.config import Config
from migratory.model.position import new_epoch
from migratory.protocol import close_codes
from migratory.server.app import Server

log = logging.getLogger("migratory.cluster")

RING_BATCHES = 20_000  # committed batches a seed keeps to stream to (re)joining non-seeds
PEER_QUEUE = 50_000  # batches queued for one non-seed before it is dropped as too slow
SUBMIT_LINGER = 0.001  # seconds publishes wait to share a Raft command
HEARTBEAT_SECONDS = 0.25
RETRY_SECONDS = 0.3
MAX_BARRIER_ATTEMPTS = 20
LEADERLESS_GRACE = 1.5  # seconds a seed may see no Raft leader (an election) and stay ready
SHED_AFTER = 3.0  # seconds not ready (after having been ready) before clients are sent away


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf of an exception group, for a log line."""
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first


def member_name(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


class GuaranteedMember:
    def __init__(self, config: Config, server: Server) -> None:
        assert config.cluster_member_listen is not None
        self.config = config
        self.server = server
        self.address = config.cluster_member_listen
        self.name = member_name(self.address)
        self.member_names = frozenset(member_name(a) for a in config.cluster_members)
        self.is_seed = config.is_seed
        self.replica = Replica(server.ctx.hub)
        self.publishing = ClusterPublishing(
            origin=f"{self.name}#{secrets.token_hex(4)}", replica=self.replica
        )
        server.ctx.publishing = self.publishing
        server.ctx.readiness = self.not_ready_reason
        server.ctx.cluster_status = self.status
        self.epoch_candidate = new_epoch()
        self.raft: RaftCoordination | None = None
        self.ring: deque[CommittedBatch] = deque(maxlen=RING_BATCHES)
        self.peers: dict[str, trio.MemorySendChannel[link.LinkOp]] = {}
        self.upstream: str | None = None
        self.upstream_clsn = 0
        self._wake = trio.Event()
        self._syncing = False
        self._token: trio.lowlevel.TrioToken | None = None
        self._leaderless_since: float | None = None

    # --- readiness and status ----------------------------------------------------

    def not_ready_reason(self) -> str | None:
        if self.replica.needs_sync or self._syncing:
            return "member is syncing its cache"
        if self.raft is not None:
            if not self.raft.syncobj.isReady():
                return "member has not caught up with Raft yet"
            return self._leaderless_reason()
        elif self.upstream is None or self.replica.applied_clsn < self.upstream_clsn:
            return "member is not replicating from a seed yet"
        return None

    def _leaderless_reason(self) -> str | None:
        """A seed cut off from a majority knows no leader and falls behind: not ready."""
        assert self.raft is not None
        if self.raft.has_leader:
            self._leaderless_since = None
            return None
        now = time.monotonic()
        if self._leaderless_since is None:
            self._leaderless_since = now
        if now - self._leaderless_since < LEADERLESS_GRACE:
            return None
        return f"member has seen no Raft leader for over {LEADERLESS_GRACE} s"

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "member": self.name,
            "index": self.config.member_index,
            "role": "seed" if self.is_seed else "non-seed",
            "mode": "Guaranteed",
            "ready": self.not_ready_reason() is None,
            "not_ready_reason": self.not_ready_reason(),
            "applied_clsn": self.replica.applied_clsn,
            "replicating_from": self.upstream,
            "replicas_served": sorted(self.peers),
            "publishing": self.publishing.statistics(),
        }
        if self.raft is not None:
            status.update(self.raft.status())
        return status

    # --- running -----------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self.publishing.on_outgoing = lambda: self._wake.set()
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                functools.partial(trio.serve_tcp, host=self.config.cluster_bind[0]),
                self._serve_peer,
                self.config.cluster_bind[1],
            )
            log.info("cluster link on %s (%s)", self.name, "seed" if self.is_seed else "non-seed")
            del listeners
            if self.is_seed:
                self.raft = RaftCoordination(
                    self_address=self.address,
                    bind_address=self.config.cluster_bind,
                    seed_addresses=self.config.seed_members,
                    password=self.config.cluster_password,
                    on_commit=self._from_raft_thread_commit,
                    data_dir=Path(self.config.cluster_data_dir),
                    timings=RaftTimings(
                        compaction_entries=self.config.cluster_log_compaction_entries,
                        compaction_seconds=self.config.cluster_log_compaction_time,
                    ),
                )
                nursery.start_soon(self._submit_loop)
            else:
                nursery.start_soon(self._upstream_loop)
            nursery.start_soon(self._housekeeping_loop)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                if self.raft is not None:
                    with trio.CancelScope(shield=True):
                        await trio.to_thread.run_sync(self.raft.close)

    # --- committed stream ----------------------------------------------------------

    def _from_raft_thread_commit(self, batch: CommittedBatch) -> None:
        assert self._token is not None
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._committed, batch)

    def _committed(self, batch: CommittedBatch) -> None:
        offer = self.publishing.on_committed(batch, trio.current_time())
        if offer is Offer.DUPLICATE:
            return
        self.ring.append(batch)
        for name, queue in list(self.peers.items()):
            try:
                queue.send_nowait(link.Batch(batch))
            except trio.WouldBlock:
                log.warning("replica %s too slow; dropping its link (it will resync)", name)
                queue.close()
                del self.peers[name]
        if offer is Offer.GAP and not self._syncing and self.is_seed:
            self._syncing = True
            self.server.nursery.start_soon(self._sync_from_a_peer_seed)

    # --- seeds: Raft submission -----------------------------------------------------

    async def _next_requests(self) -> list[PublishRequest]:
        """The publishes taken since the last call, after a short linger to batch them."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            await trio.sleep(SUBMIT_LINGER)
            requests = self.publishing.take_outgoing()
            if requests:
                return requests

    async def _submit_loop(self) -> None:
        assert self.raft is not None
        while True:
            self._submit(await self._next_requests(), reply_to=None)

    def _submit(self, requests: list[PublishRequest], reply_to: str | None) -> None:
        assert self.raft is not None and self._token is not None
        origins = [(r.origin, r.ref) for r in requests]
        token = self._token

        def done(clsn: int | None, error: str | None, unknown: bool) -> None:
            if error is None:
                return  # acknowledged from the committed stream
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._submit_failed, origins, error, unknown, reply_to)

        self.raft.submit(self.epoch_candidate, requests, done)

    def _submit_failed(
        self, origins: list[tuple[str, int]], error: str, unknown: bool, reply_to: str | None
    ) -> None:
        if unknown:
            # The batch may still commit (the old leader may have replicated it). Once a
            # barrier submitted now commits, anything before it that will ever commit has
            # been applied: whatever is still pending then is definitely lost.
            if reply_to is None:
                self.publishing.on_failed(origins, error, unknown=True, now=trio.current_time())
            self._submit_barrier(origins, error, reply_to, attempt=1)
            return
        self._settle(origins, f"not published: {error}", reply_to)

    def _settle(self, origins: list[tuple[str, int]], reason: str, reply_to: str | None) -> None:
        """Definite failure of whatever of ``origins`` is still pending."""
        if reply_to is None:
            self.publishing.on_failed(origins, reason, unknown=False, now=trio.current_time())
            return
        queue = self.peers.get(reply_to)
        if queue is not None:
            with contextlib.suppress(trio.WouldBlock):
                queue.send_nowait(link.ForwardFailed(tuple(origins), reason, False))

    def _submit_barrier(
        self, origins: list[tuple[str, int]], error: str, reply_to: str | None, attempt: int
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
        origins: list[tuple[str, int]],
        error: str,
        reply_to: str | None,
        barrier_error: str | None,
        attempt: int,
    ) -> None:
        if barrier_error is None:
            self._settle(origins, f"the Raft leader changed ({error})", reply_to)
        elif attempt < MAX_BARRIER_ATTEMPTS:
            self.server.nursery.start_soon(self._retry_barrier, origins, error, reply_to, attempt)
        # else: the publish timeout reports the outcome as unknown

    async def _retry_barrier(
        self, origins: list[tuple[str, int]], error: str, reply_to: str | None, attempt: int
    ) -> None:
        await trio.sleep(RETRY_SECONDS / 3)
        self._submit_barrier(origins, error, reply_to, attempt + 1)

    async def _sync_from_a_peer_seed(self) -> None:
        """A seed that found a gap (Raft gave it a state dump) copies a peer's caches."""
        try:
            others = [a for a in self.config.seed_members if a != self.address]
            while self.replica.needs_sync:
                for address in random.sample(others, len(others)):
                    try:
                        channel = await connect(
                            address, member=self.name, password=self.config.cluster_password
                        )
                        await channel.send(link.SyncRequest())
                        op = await channel.receive()
                        await channel.aclose()
                    except (OSError, link.LinkError, trio.TooSlowError) as exc:
                        log.info("cache sync from %s failed: %s", member_name(address), exc)
                        continue
                    if isinstance(op, link.Sync):
                        self.replica.install_sync(op.sync, trio.current_time())
                        log.info("cache synced from %s at clsn %d", member_name(address),
                                 op.sync.clsn)
                        if not self.replica.needs_sync:
                            return
                await trio.sleep(RETRY_SECONDS)
        finally:
            self._syncing = False

    # --- seeds: serving peers -----------------------------------------------------

    async def _serve_peer(self, stream: trio.SocketStream) -> None:
        channel = LinkChannel(
            stream, role="accept", member=self.name, password=self.config.cluster_password
        )
        try:
            peer = await channel.handshake(self.member_names)
        except (link.LinkError, trio.TooSlowError, OSError, EOFError) as exc:
            log.warning("cluster link refused: %s", exc)
            await channel.aclose()
            return
        send, receive = trio.open_memory_channel[link.LinkOp](PEER_QUEUE)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._peer_writer, channel, receive, nursery.cancel_scope)
                while True:
                    op = await channel.receive()
                    if op is None:
                        break
                    self._on_peer_op(peer, op, send)
                nursery.cancel_scope.cancel()
        except* (link.LinkError, OSError, trio.BrokenResourceError) as group:
            log.info("link from %s ended: %s", peer, _first(group))
        finally:
            if self.peers.get(peer) is send:
                del self.peers[peer]
            await channel.aclose()

    async def _peer_writer(
        self,
        channel: LinkChannel,
        receive: trio.MemoryReceiveChannel[link.LinkOp],
        scope: trio.CancelScope,
    ) -> None:
        try:
            async with receive:
                while True:
                    with trio.move_on_after(HEARTBEAT_SECONDS):
                        op = await receive.receive()
                        await channel.send(op)
                        continue
                    await channel.send(link.Heartbeat(self.replica.applied_clsn))
        except (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            scope.cancel()

    def _on_peer_op(
        self, peer: str, op: link.LinkOp, send: trio.MemorySendChannel[link.LinkOp]
    ) -> None:
        if isinstance(op, link.Replicate):
            self._start_replication(peer, op.from_clsn, op.full, send)
        elif isinstance(op, link.Forward):
            if self.raft is None:
                raise link.LinkError("only seeds take forwarded publishes")
            self.peers.setdefault(peer, send)
            self._submit(list(op.requests), reply_to=peer)
        elif isinstance(op, link.SyncRequest):
            send.send_nowait(link.Sync(self.replica.make_sync()))
        else:
            raise link.LinkError(f"unexpected {type(op).__name__} from {peer}")

    def _start_replication(
        self, peer: str, from_clsn: int, full: bool, send: trio.MemorySendChannel[link.LinkOp]
    ) -> None:
        """Catch a non-seed up from ``from_clsn`` (ring or full sync), then stream live."""
        ring = self.ring
        if full:
            send.send_nowait(link.Sync(self.replica.make_sync()))
        elif ring and ring[0].clsn <= from_clsn + 1 and from_clsn <= self.replica.applied_clsn:
            for batch in ring:
                if batch.clsn > from_clsn:
                    send.send_nowait(link.Batch(batch))
        elif from_clsn != self.replica.applied_clsn:
            send.send_nowait(link.Sync(self.replica.make_sync()))
        send.send_nowait(link.Heartbeat(self.replica.applied_clsn))
        self.peers[peer] = send
        log.info("replicating to %s from clsn %d", peer, from_clsn)

    # --- non-seeds: replicating from a seed ------------------------------------------

    async def _upstream_loop(self) -> None:
        seeds = list(self.config.seed_members)
        random.shuffle(seeds)
        turn = 0
        while True:
            address = seeds[turn % len(seeds)]
            turn += 1
            try:
                channel = await connect(
                    address, member=self.name, password=self.config.cluster_password
                )
            except (OSError, link.LinkError, trio.TooSlowError, EOFError) as exc:
                log.debug("seed %s unreachable: %s", member_name(address), exc)
                await trio.sleep(RETRY_SECONDS)
                continue
            self.upstream = member_name(address)
            log.info("replicating from seed %s at clsn %d", self.upstream,
                     self.replica.applied_clsn)
            try:
                await self._replicate_from(channel)
            except* (OSError, link.LinkError, trio.BrokenResourceError) as group:
                log.warning("lost seed %s: %s", self.upstream, _first(group))
            finally:
                self.upstream = None
                await channel.aclose()

    async def _replicate_from(self, channel: LinkChannel) -> None:
        # after a gap nothing can be applied until a full cache sync
        replicate = link.Replicate(self.replica.applied_clsn, full=self.replica.needs_sync)
        await channel.send(replicate)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._forward_loop, channel)
            while True:
                op = await channel.receive()
                if op is None:
                    break
                now = trio.current_time()
                if isinstance(op, link.Batch):
                    self._committed(op.batch)
                elif isinstance(op, link.Sync):
                    self.replica.install_sync(op.sync, now)
                elif isinstance(op, link.Heartbeat):
                    self.upstream_clsn = op.clsn
                elif isinstance(op, link.ForwardFailed):
                    self.publishing.on_failed(
                        list(op.origins), op.reason, unknown=op.unknown, now=now
                    )
                if self.replica.needs_sync:
                    got = op.batch.clsn if isinstance(op, link.Batch) else None
                    raise link.LinkError(
                        f"gap in the committed stream at clsn {self.replica.applied_clsn} "
                        f"(received {type(op).__name__} {got}); resyncing"
                    )
            nursery.cancel_scope.cancel()

    async def _forward_loop(self, channel: LinkChannel) -> None:
        while True:
            await channel.send(link.Forward(tuple(await self._next_requests())))

    # --- both ---------------------------------------------------------------------------

    async def _housekeeping_loop(self) -> None:
        reported: str | None = "starting"
        not_ready_since: float | None = None
        shed = False
        while True:
            await trio.sleep(0.5)
            now = trio.current_time()
            self.publishing.expire(now)
            reason = self.not_ready_reason()  # also samples how long no leader was seen
            if reason != reported:
                if reason is None:
                    log.info("member %s is ready for clients", self.name)
                else:
                    log.warning("member %s is not ready: %s", self.name, reason)
            if reason is None:
                not_ready_since, shed = None, False
            elif reported is None:
                not_ready_since = now  # was ready: a member cut off from the cluster
            reported = reason
            if not shed and not_ready_since is not None and now - not_ready_since >= SHED_AFTER:
                shed = True
                count = self.server.shed_clients(
                    close_codes.TRY_AGAIN_LATER.code, f"member cut off from the cluster: {reason}"
                )
                log.warning("member %s sent %d clients to other members (%s)",
                            self.name, count, reason)
