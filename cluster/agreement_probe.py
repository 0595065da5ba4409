"""The agreement probe: a member asks every seed, and its own address, whether they
agree with its cluster settings (the rule is :mod:`cluster.agreement`; this is the I/O).

A round dials them all at once (each a link set up and closed at once), records each
seed's verdict in :class:`~cluster.agreement.SeedAgreement`, and is repeated every
:data:`PROBE_SECONDS` (every :data:`RETRY_SECONDS` while a seed could not be asked: a
member started before the seeds learns their verdict soon after they are up). Within a
round, a seed that could not be asked is asked again every :data:`RETRY_SECONDS` while
another question is still out, and the verdicts count as they come: when a whole
cluster restarts at once, a seed still starting (its port taken, no answer yet: a box
far busier than its cores) no longer holds the others' Raft for its question's
:data:`ASK_TIMEOUT` (``benchmarks/cluster_whole_restart.py --order stalled``).

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
        self._answered = trio.Event()
        """Set (and replaced) at each answer and at each round's end."""
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
            over = trio.Event()
            async with trio.open_nursery() as retries:
                async with trio.open_nursery() as nursery:
                    for address in self.targets:
                        nursery.start_soon(self._ask_first, address, retries, over)
                over.set()  # the round is over: retries that wait stop, the next round asks
            self.agreement.rounds += 1
            self._wake()
            await trio.sleep(min(self.period, RETRY_SECONDS) if self._unasked else self.period)

    def _wake(self) -> None:
        self._answered.set()
        self._answered = trio.Event()

    async def wait_agreed(self, *, majority: bool) -> None:
        """Until nothing stands against this member and, with ``majority``, a majority
        of the seeds linked (:meth:`~cluster.agreement.SeedAgreement.settled`): looked at
        after each answer, so a round's slowest question (a seed that took the dial and
        does not answer, up to :data:`ASK_TIMEOUT`) does not hold a seed whose majority
        has agreed."""
        while not self.agreement.settled(majority=majority):
            await self._answered.wait()

    async def _ask_first(
        self, address: tuple[str, int], retries: trio.Nursery, over: trio.Event
    ) -> None:
        """Ask ``address``; when it cannot be asked (not up yet: refused), ask it again
        every :data:`RETRY_SECONDS` in ``retries`` until the round's other questions have
        ended (``over``; one may last :data:`ASK_TIMEOUT`: a seed that took the dial and
        does not answer): a seed that comes up meanwhile is heard in this round."""
        if not await self._ask(address):
            self._unasked += 1
            retries.start_soon(self._ask_again, address, over)

    async def _ask_again(self, address: tuple[str, int], over: trio.Event) -> None:
        """A question under way when the round ends is not cut off: it ends as any
        question does (answered, refused, or :data:`ASK_TIMEOUT`). Cancelled, its link
        closed in the middle of the TLS handshake -- the seed, just up, logged a refused
        link (UNEXPECTED_EOF) -- and the answer it was about to give was lost."""
        while True:
            with trio.move_on_after(RETRY_SECONDS):
                await over.wait()
            if over.is_set():
                return
            if await self._ask(address):
                self._unasked -= 1
                return

    async def _ask(self, address: tuple[str, int]) -> bool:
        """One question to ``address``; whether it was asked (answered, or refused)."""
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
            self.agreement.own_checked = self.agreement.own_checked or asked
        elif asked:
            self.agreement.record(name, verdict)
        else:
            self.agreement.forget(name)
        self._wake()
        return asked

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
