"""A cluster member: the cluster package composes a server with its roles.

The layers, top down (imports go one way: nothing under ``migratory/`` imports
``cluster/``)::

    cluster.node      builds the member: hub, replica, publishing, stream, roles, Server
      roles           seed.SeedCoordination (Raft)  |  upstream.UpstreamReplication
                      peers.PeerService (links from peers)   readiness.Readiness
      cluster.stream  the committed stream: replica + acknowledgements + followers
      migratory.server.Server   sockets, sessions, batching -- given its publishing
                      path and readiness when built
      migratory.server.hub.Hub  pub/sub semantics: subjects, caches, fan-out

A Guaranteed member's hub numbers nothing itself (epoch ``UNNUMBERED_EPOCH``): every
position comes from the committed stream.
"""

from __future__ import annotations

import functools
import logging
import secrets
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from cluster import link
from cluster.agreement import MemberSettings
from cluster.agreement_probe import AgreementProbe
from cluster.coordination import UNNUMBERED_EPOCH
from cluster.forwarding import Outgoing
from cluster.link_io import ClusterTls
from cluster.monitoring import guaranteed_metrics
from cluster.peers import PeerService
from cluster.publishing import ClusterPublishing
from cluster.readiness import Readiness, keep_house
from cluster.replica import Replica
from cluster.stream import CommittedStream
from cluster.upstream import UpstreamReplication
from migratory.config import Config
from migratory.server.app import Role, Server, build_hub

if TYPE_CHECKING:
    from cluster.seed import SeedCoordination

log = logging.getLogger("migratory.cluster")

# A Guaranteed member runs two busy threads (trio and pysyncobj's tick thread) that hand
# every batch back and forth; CPython's default 5 ms GIL switch interval made each
# hand-off wait. Measured: 25.5k acks/s with 0.5 ms against 15.7-18.1k with the default.
GIL_SWITCH_INTERVAL = 0.0005
LEAVE_POLL = 0.05
"""Seconds between two looks at whether a seed whose Raft node stopped has the outcome
of every publish it had taken (``GuaranteedNode._leave_after_raft_stopped``)."""


def member_name(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


class GuaranteedNode:
    """One Guaranteed-mode member: a server and the roles its place in the cluster needs."""

    def __init__(self, config: Config) -> None:
        assert config.cluster_member_listen is not None
        self.config = config
        self.name = member_name(config.cluster_member_listen)
        self.is_seed = config.is_seed
        hub = build_hub(config, epoch=UNNUMBERED_EPOCH, numbered_elsewhere=True)
        self.replica = Replica(hub)
        self.publishing = ClusterPublishing(
            origin=f"{self.name}#{secrets.token_hex(4)}",
            replica=self.replica,
            max_pending=config.cluster_max_pending_publishes,
        )
        self.stream = CommittedStream(self.publishing, is_ready=self._is_ready)
        self.outgoing = Outgoing(self.publishing)
        settings = MemberSettings.from_config(config, incarnation=secrets.token_hex(4))
        tls = ClusterTls.from_config(config)
        self.agreement = AgreementProbe(
            settings=settings, seeds=config.seed_members, own=config.cluster_member_listen,
            password=config.cluster_password, tls=tls,
            max_frame=link.connected_frame_limit(config.max_frame_size),
            leading=self._leading,  # (the leader asks the seeds where they stand too)
        )
        self._role_started = False
        self.seed: SeedCoordination | None = None
        self.upstream: UpstreamReplication | None = None
        self._settings, self._tls = settings, tls
        if self.is_seed:
            # (Raft, pysyncobj, cryptography: 91 modules a non-seed never runs)
            from cluster.seed import SeedCoordination

            self.seed = SeedCoordination(
                config=config, name=self.name, stream=self.stream, outgoing=self.outgoing,
                settings=settings, leave=self._leave_after_raft_stopped,
            )
        else:
            self.upstream = self._upstream(config.seed_members)
        self.peers = PeerService(
            name=self.name,
            members=frozenset(member_name(a) for a in config.cluster_members),
            password=config.cluster_password,
            tls=tls,
            stream=self.stream,
            take_forward=None if self.seed is None else self.seed.take_forward,
            settings=settings,
            max_frame=link.accepted_frame_limit(config.max_frame_size),
            max_message_size=config.max_message_size,
        )
        self.readiness = Readiness(
            self.replica,
            self._role_reason,
            syncing=lambda: self.seed is not None and self.seed.syncing,
            agreement=self.agreement.reason,
            clock=trio.current_time,
        )
        self.server = Server(
            config,
            hub=hub,
            publishing=self.publishing,
            readiness=self.readiness.reason,
            cluster_status=self.status,
            cluster_metrics=lambda: guaranteed_metrics(self),
            cluster_activity=None if self.seed is None else self._seed_activity,
        )

    def _upstream(self, seeds: Sequence[tuple[str, int]]) -> UpstreamReplication:
        config = self.config
        return UpstreamReplication(
            name=self.name,
            seeds=seeds,
            password=config.cluster_password,
            tls=self._tls,
            stream=self.stream,
            outgoing=self.outgoing,
            settings=self._settings,
            max_frame=link.connected_frame_limit(config.max_frame_size),
            answered=self.agreement.agreement.agreed,
        )

    async def _leave_after_raft_stopped(self, reason: str) -> None:
        """This seed's Raft node stopped (its disk): before the member exits, it follows
        another seed as a non-seed does -- its hub fed, its clients' publishes forwarded
        through that seed, those its Raft node did not answer again first (copies are
        numbered once: cluster/coordination.py) -- and drains its clients as on SIGTERM
        (every publish taken gets its outcome, then 4502 DRAINED: they move, resuming
        from their positions). Its clients' publishes used to be refused RAFT_STOPPED,
        and those in flight were left unanswered as it exited (docs/cluster.md)."""
        assert self.config.cluster_member_listen is not None
        others = [a for a in self.config.seed_members if a != self.config.cluster_member_listen]
        self.upstream = self._upstream(others)
        log.warning("Raft stopped (%s): this seed's clients are drained, their publishes "
                    "through another seed, before the member exits", reason)
        taken = self.publishing.last_ref
        async with trio.open_nursery() as nursery:
            await nursery.start(self.upstream.run)
            # first what was taken before the stop, new publishes forwarded meanwhile: a
            # drain from the stop on refused every publish until its client was told --
            # 2,311-3,899 at 2,000/s, where a client is told once its publishes are settled
            with trio.move_on_after(self.publishing.publish_timeout / 2):
                while self.publishing.waiting_up_to(taken):
                    await trio.sleep(LEAVE_POLL)
            if self.server.drain.draining:  # a SIGTERM's drain is on: it ends the member
                await trio.sleep_forever()
            await self.server.drain.run(lambda: self.server.connections)
            nursery.cancel_scope.cancel()

    def _leaving(self) -> bool:
        """A seed that follows another seed: it is leaving, its Raft node stopped
        (:meth:`_leave_after_raft_stopped` gives a seed its upstream; nothing else does)."""
        return self.seed is not None and self.upstream is not None

    def _role_reason(self, now: float) -> str | None:
        if not self._role_started:
            return self.agreement.agreement.waiting()
        if self.seed is not None:
            return self.seed.not_ready_reason()
        assert self.upstream is not None
        return self.upstream.not_ready_reason(now)

    def _seed_activity(self) -> int:
        assert self.seed is not None
        return self.seed.activity

    def _is_ready(self) -> bool:
        return self.readiness.reason() is None

    def status(self) -> dict[str, Any]:
        reason = self.readiness.reason()
        status: dict[str, Any] = {
            "member": self.name,
            "server_name": self.config.server_name,
            "index": self.config.member_index,
            "role": "seed" if self.is_seed else "non-seed",
            "mode": "Guaranteed",
            "ready": reason is None,
            "not_ready_reason": reason,
            "applied_clsn": self.replica.applied_clsn,
            "replicating_from": None if self.upstream is None else self.upstream.view.seed,
            "replicas_served": sorted(self.stream.followers),
            "seeds_disagreeing": self.agreement.agreement.against(),
            "seeds_not_applying": self.agreement.progress.stuck(),
            "publishing": self.publishing.statistics(),
        }
        if self.seed is not None and self.seed.raft is not None:
            status.update(self.seed.raft.status())
            status["raft_commands"] = self.seed.commit_statistics()
        return status

    def _leading(self) -> int | None:
        """This seed's applied clsn while it is the Raft leader (cluster/seed_progress.py)."""
        status = None if self.seed is None else self.seed.raft_status
        return self.replica.applied_clsn if status and status.state == "leader" else None

    async def _start_role(self, nursery: trio.Nursery) -> None:
        """Raft (a seed, once a majority of the seeds linked) or replication from a seed
        (a non-seed), once nothing stands against this member: never under a name another
        process holds, nor with settings the seeds refuse (the readiness says why)."""
        await self.agreement.wait_agreed(majority=self.is_seed)
        self._role_started = True
        role: Role = self.seed if self.seed is not None else self.upstream  # type: ignore[assignment]
        await nursery.start(role.run)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sys.setswitchinterval(GIL_SWITCH_INTERVAL)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.peers.run, self.config.cluster_bind)
            log.info("cluster link on %s (%s)", self.name, "seed" if self.is_seed else "non-seed")
            if self.seed is not None:
                await self.seed.check_data_dir()
            await nursery.start(self.agreement.run)
            nursery.start_soon(self._start_role, nursery)
            nursery.start_soon(functools.partial(
                keep_house, f"member {self.name}", self.publishing, self.readiness, self.server,
                leaving=self._leaving,
            ))
            task_status.started()
