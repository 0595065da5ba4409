"""The agreement probe: a member asks every seed, and its own address, whether they
agree with its cluster settings (the rule is :mod:`cluster.agreement`; this is the I/O).

A round dials them all at once (each a link set up and closed at once), records each
seed's verdict in :class:`~cluster.agreement.SeedAgreement`, and is repeated every
:data:`PROBE_SECONDS` (every :data:`RETRY_SECONDS` while a seed could not be asked: a
member started before the seeds learns their verdict soon after they are up).

The member's readiness includes the agreement's reason, and a Guaranteed member starts
its role (Raft, or replication from a seed) only once the agreement has none
(:meth:`AgreementProbe.wait_agreed`): a member that the seeds' majority refuses, or that
finds another process at its own address, never runs Raft under a name that is not its
own nor follows a seed in another member's place. A seed waits besides for a majority
of the seeds to have linked with it, so it does not run Raft even when it starts before
the seeds can answer; a non-seed does not (one seed it reaches is enough to serve from,
and every link it opens compares the settings).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import trio

from cluster import link
from cluster.agreement import MemberSettings, Repeats, SeedAgreement
from cluster.link_faults import U64
from cluster.link_io import (
    CONNECT_ERRORS,
    DIAL_TIMEOUT,
    HANDSHAKE_TIMEOUT,
    ClusterTls,
    Disagreement,
    LinkChannel,
    connect,
)
from cluster.seed_progress import SeedProgress

log = logging.getLogger("migratory.cluster")

PROBE_SECONDS = 10.0
"""Seconds between two rounds of questions to the seeds."""
RETRY_SECONDS = 0.3
"""Seconds to the next round when a seed could not be asked (down, still starting)."""
ASK_TIMEOUT = DIAL_TIMEOUT + 2 * HANDSHAKE_TIMEOUT
"""A seed that has not answered within this long counts for nothing this round."""


def _name(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


class AgreementProbe:
    """Asks the seeds and this member's own address; holds the verdicts."""

    def __init__(
        self,
        *,
        settings: MemberSettings,
        seeds: Sequence[tuple[str, int]],
        own: tuple[str, int],
        password: str,
        tls: ClusterTls | None = None,
        period: float = PROBE_SECONDS,
        max_frame: int,
        leading: Callable[[], int | None] = lambda: None,
        progress: SeedProgress | None = None,
    ) -> None:
        """``leading``: this member's applied clsn while it is the Raft leader (None
        otherwise): it then asks each seed where it stands too (``progress``)."""
        self.settings = settings
        self.agreement = SeedAgreement(me=settings.member, seeds=settings.seeds)
        self.targets = [own, *(a for a in seeds if a != own)]
        self.password = password
        self.tls = tls
        self.max_frame = max_frame
        self.period = period
        self.refusals = Repeats()
        self._round_done = trio.Event()
        self._unasked = 0
        self.leading = leading
        self.progress = SeedProgress() if progress is None else progress

    def reason(self) -> str | None:
        return self.agreement.reason()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            self._unasked = 0
            if self.leading() is None:
                self.progress.seen.clear()  # (a leader's, of its term)
            async with trio.open_nursery() as nursery:
                for address in self.targets:
                    nursery.start_soon(self._ask, address)
            self.agreement.rounds += 1
            self._round_done.set()
            self._round_done = trio.Event()
            await trio.sleep(min(self.period, RETRY_SECONDS) if self._unasked else self.period)

    async def wait_agreed(self, *, majority: bool) -> None:
        """Until a round has ended with nothing against this member and, with
        ``majority``, a majority of the seeds linked
        (:meth:`~cluster.agreement.SeedAgreement.settled`)."""
        while not self.agreement.settled(majority=majority):
            await self._round_done.wait()

    async def _ask(self, address: tuple[str, int]) -> None:
        name = _name(address)
        verdict: str | None = None
        asked = False
        leader_clsn = None if address == self.targets[0] else self.leading()
        try:
            with trio.fail_after(ASK_TIMEOUT):
                channel = await connect(address, member=self.settings.member,
                                        password=self.password, tls=self.tls,
                                        settings=self.settings, max_frame=self.max_frame)
                try:
                    if leader_clsn is not None:
                        await self._where(channel, name, leader_clsn)
                finally:
                    await channel.aclose()
            asked = True  # agrees (or, peer_settings None, too old to compare)
        except Disagreement as exc:
            verdict, asked = exc.reason, True
        except (*CONNECT_ERRORS, trio.TooSlowError) as exc:
            log.debug("agreement probe: %s not asked: %s", name, exc)
        except Exception:  # one question to one member, never the member
            log.exception("agreement probe: asking %s failed", name)
        if verdict is not None and self.refusals.first(name, verdict, trio.current_time()):
            log.warning("cluster settings: %s", verdict)
        if not asked:
            self.progress.forget(name)
        if address == self.targets[0]:
            self.agreement.own_address = verdict
        elif asked:
            self.agreement.record(name, verdict)
        else:
            self.agreement.forget(name)
            self._unasked += 1

    async def _where(self, channel: LinkChannel, name: str, leader_clsn: int) -> None:
        """Ask the seed on ``channel`` where it stands: a sync no seed can serve, refused
        with the clsn it applied (cluster/seed_progress.py)."""
        await channel.send(link.SyncRequest(U64 - 1))
        for _ in range(8):  # (what else an acceptor may send first: a heartbeat)
            op = await channel.receive()
            if op is None:
                return
            if isinstance(op, link.SyncRefused):
                warning = self.progress.observe(name, op.clsn, leader_clsn,
                                                trio.current_time())
                if warning is not None:
                    log.warning("cluster: %s", warning)
                return
