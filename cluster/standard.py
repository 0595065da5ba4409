"""Standard-mode clustering: no consensus, members forward publications.

Each member numbers messages with its own epoch, so a client that fails over
to another member has a position that member does not know: it gets the
snapshot and ``DATA_RESYNC`` (the seed's Standard Message Delivery). A member
forwards every publication it takes from a client to all other members over
the authenticated cluster link, best effort: while a peer is unreachable its
forwards are dropped (counted), as Standard mode promises no more -- but never
silently: the sender numbers its forwards of each subject, a receiver that sees a gap
resyncs the subject's subscribers, and a sender forwards again its last forward of each
subject it dropped or lost with a link (:mod:`cluster.standard_lineage`). A receiver
remembers the process (incarnation) it last met of each peer: a restarted peer's seq 1
is not taken as the first of a subject held here before (its earlier life may have
died with a forward unsent) -- unless, with a ClusterDataDir, the peer's earlier life
said goodbye here at the end of its drain and the new life names it as its clean
predecessor (:mod:`cluster.standard_lives`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from pathlib import Path
from typing import Any

import trio

from cluster import link
from cluster.agreement import MemberSettings, Repeats
from cluster.agreement_probe import AgreementProbe
from cluster.link_accept import HandshakeGate, accept_link, peer_host
from cluster.link_io import CONNECT_ERRORS, ClusterTls, Disagreement, LinkChannel, connect, secured
from cluster.link_publishes import PeerPublishes
from cluster.monitoring import standard_metrics
from cluster.peers import bind_error
from cluster.standard_lineage import Forward, ForwardLineage, ForwardNumbering, UnsentSubjects
from cluster.standard_lives import LifeRecord, new_incarnation, reads_goodbyes
from cluster.upstream import RETRY_SECONDS, member_name
from migratory.config import Config
from migratory.model.message import Message
from migratory.model.position import Position, new_epoch
from migratory.server.accept import serve_tcp
from migratory.server.app import Server, build_hub
from migratory.server.context import LocalPublishing, PublishReply
from migratory.server.hub import Hub

log = logging.getLogger("migratory.cluster")

PEER_QUEUE = 1_000
LEAVE_SECONDS = 3.0
"""How long a drained member waits for its goodbyes (StandardGoodbye) to go out."""


class StandardPublishing(LocalPublishing):
    def __init__(self, hub: Hub, member: StandardNode) -> None:
        super().__init__(hub, clock=trio.current_time)
        self._member = member

    def submit(self, message: Message, reply: PublishReply | None, now: float) -> None:
        super().submit(message, reply, now)
        self._member.forward(message)

    def statistics(self) -> dict[str, Any]:
        return {"mode": "standard", "forward_dropped": self._member.dropped,
                "forward_gaps": self._member.lineage.gaps}


class StandardNode:
    """A Standard-mode member: a server whose publishes are also forwarded to peers."""

    def __init__(self, config: Config) -> None:
        assert config.cluster_member_listen is not None
        self.config = config
        self.tls = ClusterTls.from_config(config)
        self.hub = build_hub(config, hold_sessions=True)  # (away MQTT sessions: made)
        self.address = config.cluster_member_listen
        self.name = member_name(self.address)
        self.member_names = frozenset(member_name(a) for a in config.cluster_members)
        self.queues: dict[str, trio.MemorySendChannel[Message | None]] = {}
        """Per peer, its forwards (None: a wake-up, the forwarder looks at ``leaving``)."""
        self.connected: set[str] = set()
        self.dropped = 0
        self.lineage = ForwardLineage()
        self.numbering = ForwardNumbering()
        """This member's forwards, numbered so that peers see what they miss."""
        self.unsent: dict[str, UnsentSubjects] = {}
        """Per peer, what to forward again once its queue is empty (a repair)."""
        """The peers' positions of what they forwarded (gaps: :mod:`cluster.standard_lineage`)."""
        self.gap_warnings = Repeats()
        self.lives = (LifeRecord(Path(config.cluster_data_dir), self.name)
                      if config.cluster_data_dir else None)
        """This member's lives (None: no ClusterDataDir, no chain: docs/cluster.md)."""
        self.life, incarnation = (self.lives.begin() if self.lives is not None
                                  else new_incarnation(None))
        self.leaving = False
        """A SIGTERM's drain is over, the server stopped: goodbyes go out (:meth:`leave`)."""
        self.goodbyes: set[str] = set()
        """The peers told goodbye: a forward numbered after the first is ``late``."""
        self.late = False
        self.readers: set[str] = set()
        """Linked peers that read goodbyes (:func:`reads_goodbyes`)."""
        self.unrepairable: set[str] = set()
        """Peers a repair was not possible for (its last forward forgotten): no goodbye."""
        self.settings = MemberSettings.from_config(config, incarnation=incarnation)
        self.agreement = AgreementProbe(
            settings=self.settings, seeds=config.seed_members, own=self.address,
            password=config.cluster_password, tls=self.tls,
            max_frame=link.connected_frame_limit(config.max_frame_size),
        )
        self.refusals = Repeats()
        self.publishes = PeerPublishes(config.max_message_size)
        """The check of a peer's publish, a client's (:mod:`cluster.link_publishes`)."""
        self.handshakes = HandshakeGate()
        """Connections still proving the password (MAX_PENDING_HANDSHAKES at once)."""
        self.server = Server(
            config,
            hub=self.hub,
            publishing=StandardPublishing(self.hub, self),
            readiness=self.agreement.reason,
            cluster_status=self.status,
            cluster_metrics=lambda: standard_metrics(self),
        )

    def status(self) -> dict[str, Any]:
        return {
            "member": self.name,
            "index": self.config.member_index,
            "role": "member",
            "mode": "Standard",
            "ready": self.agreement.reason() is None,
            "not_ready_reason": self.agreement.reason(),
            "seeds_disagreeing": self.agreement.agreement.against(),
            "epoch": self.hub.epoch,
            "forwarding_to": sorted(self.connected),
            "forward_dropped": self.dropped,
            "forward_queued": {name: queue.statistics().current_buffer_used
                               for name, queue in sorted(self.queues.items())},
            "forward_gaps": self.lineage.gaps,
        }

    def forward(self, message: Message) -> None:
        if self.goodbyes and not self.late:  # (none once the server stopped: never seen)
            log.warning("a forward of %s after a goodbye: the next life names no "
                        "predecessor", message.subject)
            self.late = True
            if self.lives is not None:
                self.lives.end_unclean(self.life)
        numbered = self.numbering.number(message)
        for name, queue in self.queues.items():
            self.forward_to(name, queue, numbered)

    def _repair(self, name: str, queue: trio.MemorySendChannel[Message | None]) -> None:
        """Forward again the last forward of each subject ``name`` may lack."""
        for subject in self.unsent[name].repairs():
            last = self.numbering.last(subject)
            if last is None:
                self.unrepairable.add(name)  # (no goodbye can say every forward came)
                continue  # forgotten: its next forward starts an epoch, a gap there
            self.forward_to(name, queue, last)

    def forward_to(self, name: str, queue: trio.MemorySendChannel[Message | None],
                   message: Message) -> None:
        try:
            queue.send_nowait(message)
        except trio.WouldBlock:
            self.dropped += 1
            self.unsent[name].dropped(message.subject)
        else:
            self.unsent[name].queued(message.subject)

    def met(self, peer: str, channel: LinkChannel) -> str | None:
        """A link with ``peer`` is set up: its process's incarnation (None: a member
        that predates link settings), remembered (:meth:`ForwardLineage.met`)."""
        settings = channel.peer_settings
        incarnation = None if settings is None else settings.incarnation
        if self.lineage.met(peer, incarnation, self.hub.holdings_made):
            log.info("%s's new life (%s) follows the one that said goodbye: its subjects "
                     "go on without a resync", peer, incarnation)
        return incarnation

    def take_forward(self, peer: str, message: Message, now: float, *,
                     incarnation: str | None = None) -> None:
        """A publication ``peer`` forwarded (checked) on a link of its process
        ``incarnation``: published here, after a resync of its subject when ``peer`` may
        have numbered some that never came; dropped when it came already (a repair)."""
        taken = self.lineage.take(peer, message, incarnation=incarnation,
                                  made=self.hub.made(message.subject))
        if taken is Forward.SEEN:
            return  # a repair of what came after all
        if taken is Forward.GAP:
            self._resync(peer, message, now)
        self.hub.publish(message, now)

    def _resync(self, peer: str, message: Message, now: float) -> None:
        """``peer`` may have numbered messages of ``message``'s subject that never came
        here: a new lineage of the subject, its subscribers told (snapshot, DATA_RESYNC)."""
        subject = message.subject
        position = self.hub.position(subject)
        if position is None and self.hub.made(subject) is None:
            return  # nobody holds the subject here: no subscriber to miss anything
        # (not held, but a wildcard filter matches it: its subscribers are told too)
        if self.gap_warnings.first(peer, "gap", now):
            log.warning("forwards from %s skipped some publications (%s at %d:%d after "
                        "%s here): subscribers of its subjects resync", peer, subject,
                        message.epoch, message.seq,
                        "nothing" if position is None else f"{position.epoch}:{position.seq}")
        epoch = new_epoch()  # (numbered nothing yet: its subscribers wait at (e, 0), told too)
        snapshot = self.hub.snapshot(subject)
        if snapshot is not None:
            snapshot = dataclasses.replace(snapshot, epoch=epoch, seq=1)
        self.hub.reposition(subject, Position(epoch, 1), snapshot, (), now)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            with bind_error(self.config.cluster_bind):
                await nursery.start(
                    functools.partial(
                        serve_tcp, host=self.config.cluster_bind[0], name="cluster link port",
                        admit=self.handshakes.admit,
                    ),
                    self._serve_peer,
                    self.config.cluster_bind[1],
                )
            for address in self.config.cluster_members:
                if address != self.address:
                    send, receive = trio.open_memory_channel[Message | None](PEER_QUEUE)
                    self.queues[member_name(address)] = send
                    self.unsent[member_name(address)] = UnsentSubjects()
                    nursery.start_soon(self._forward_to, address, receive)
            log.info("cluster link on %s (Standard mode)", self.name)
            nursery.start_soon(self.agreement.run)
            task_status.started()

    async def _forward_to(
        self, address: tuple[str, int], queue: trio.MemoryReceiveChannel[Message | None]
    ) -> None:
        name = member_name(address)
        while True:
            try:
                channel = await connect(
                    address, member=self.name, password=self.config.cluster_password,
                    tls=self.tls, settings=self.settings,
                    max_frame=link.connected_frame_limit(self.config.max_frame_size))
            except Disagreement as exc:
                if self.refusals.first(name, exc.reason, trio.current_time()):
                    log.warning("not forwarding to %s: %s", name, exc.reason)
                await trio.sleep(RETRY_SECONDS)
                continue
            except CONNECT_ERRORS:
                await trio.sleep(RETRY_SECONDS)
                continue
            except Exception:
                log.exception("dialling %s failed", name)
                await trio.sleep(RETRY_SECONDS)
                continue
            if reads_goodbyes(self.met(name, channel)):
                self.readers.add(name)
            self.connected.add(name)
            unsent = self.unsent[name]
            try:
                async with trio.open_nursery() as link_tasks:
                    link_tasks.start_soon(self._watch, channel, name, link_tasks.cancel_scope)
                    try:  # (here, not around the nursery: the failure itself is logged)
                        while True:
                            if unsent.unsent and not queue.statistics().current_buffer_used:
                                self._repair(name, self.queues[name])
                            if self._may_say_goodbye(name, channel, queue):
                                self.goodbyes.add(name)  # (first: a forward meanwhile is late)
                                await channel.send(link.StandardGoodbye())
                                log.info("said goodbye to %s", name)
                            message = await queue.receive()
                            if message is None:
                                continue  # (a wake-up: leaving)
                            unsent.sent(message.subject)
                            await channel.send(link.StandardPublish(message))
                    except Exception as exc:
                        log.info("forwarding to %s interrupted: %s", name, exc)
                    link_tasks.cancel_scope.cancel()
            finally:
                self.connected.discard(name)
                unsent.link_lost()
                await channel.aclose()

    def _may_say_goodbye(self, name: str, channel: LinkChannel,
                         queue: trio.MemoryReceiveChannel[Message | None]) -> bool:
        """Leaving, every forward to ``name`` sent (and every repair), none unrepairable,
        and the peer reads goodbyes."""
        settings = channel.peer_settings
        return (self.leaving and name not in self.goodbyes and name not in self.unrepairable
                and not self.unsent[name].unsent and not queue.statistics().current_buffer_used
                and settings is not None and reads_goodbyes(settings.incarnation))

    async def leave(self) -> None:
        """After a SIGTERM's drain, the server stopped, with a ClusterDataDir: tell each
        linked peer goodbye once every forward to it went out (at most LEAVE_SECONDS),
        then record this life as ended cleanly unless a forward was numbered after a
        goodbye (:mod:`cluster.standard_lives`)."""
        if self.lives is None:
            return  # (no record: the next life names no predecessor, a goodbye says nothing)
        self.leaving = True
        for queue in self.queues.values():
            with contextlib.suppress(trio.WouldBlock):  # (full: it looks once it is empty)
                queue.send_nowait(None)
        with trio.move_on_after(LEAVE_SECONDS):
            while (self.connected & self.readers) - self.goodbyes - self.unrepairable:
                await trio.sleep(0.02)
        log.info("left: goodbye said to %s", sorted(self.goodbyes) or "no peer")
        if not self.late:
            self.lives.end_clean(self.life)

    @staticmethod
    async def _watch(channel: LinkChannel, name: str, forwarding: trio.CancelScope) -> None:
        """End the link once its peer closes it (it sends nothing after the handshake):
        an idle forwarder learns it then, not with its next forward -- what the link
        carried last is forwarded again once it is back, not left lost at the end."""
        try:
            op = await channel.receive()
        except Exception as exc:
            log.info("forwarding to %s ended: %s", name, exc)
        else:
            log.info("forwarding to %s ended by the peer%s", name,
                     "" if op is None else f" ({type(op).__name__} received)")
        forwarding.cancel()

    async def _serve_peer(self, stream: trio.SocketStream) -> None:
        source = peer_host(stream)
        channel = LinkChannel(
            secured(stream, self.tls, server_side=True),
            role="accept",
            member=self.name,
            password=self.config.cluster_password,
            settings=self.settings,
            max_frame=link.accepted_frame_limit(self.config.max_frame_size),
        )
        try:
            peer = await accept_link(channel, source=source, members=self.member_names,
                                     gate=self.handshakes, refusals=self.refusals)
            if peer is None:
                return  # refused, logged
            incarnation = self.met(peer, channel)
            with self.handshakes.linked(peer):
                while True:
                    op = await channel.receive()
                    if op is None:
                        return
                    if isinstance(op, link.StandardGoodbye):
                        self.lineage.ended(peer, incarnation)
                        log.info("%s said goodbye (%s)", peer, incarnation)
                        continue
                    if not isinstance(op, link.StandardPublish):
                        raise link.LinkError(f"unexpected {type(op).__name__} in Standard mode")
                    now = trio.current_time()
                    # refused: counted and logged; its publisher was answered by its own
                    # member (Standard forwards after the local publish), the link goes on
                    if self.publishes.refusal(peer, op.message, now) is not None:
                        self.lineage.refused(peer, incarnation)
                        continue  # (not taken: the next forward of its subject is a gap)
                    self.take_forward(peer, op.message, now, incarnation=incarnation)
        except link.LinkViolation as exc:
            self.handshakes.violated(channel.peer or "?", exc)
        except CONNECT_ERRORS as exc:
            log.warning("cluster link from %s ended: %s", channel.peer or "?", exc)
        except Exception:
            log.exception("cluster link from %s failed; closing it", channel.peer or "?")
        finally:
            await channel.aclose()
