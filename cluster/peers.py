"""The accepting side of the cluster link: what a member does for the peers that dial it.

A non-seed dials a seed to replicate the committed stream (``Replicate``), to forward
its clients' publishes (``Forward``) and, like a seed that found a gap, to ask for a
cache sync (``SyncRequest``). Each link is one task; whatever goes wrong in it --
a protocol error, a reset, a bug -- ends that link, logged with the peer's name,
never the member.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence

import trio

from cluster import link
from cluster.agreement import MemberSettings, Repeats
from cluster.coordination import PublishRequest, request_bytes
from cluster.link_accept import HandshakeGate, accept_link, peer_host
from cluster.link_io import ClusterTls, LinkChannel, describe, secured
from cluster.link_publishes import DEFAULT_MAX_MESSAGE_SIZE, PeerPublishes
from cluster.link_sync import SyncFrames
from cluster.stream import FOLLOWER_QUEUE, Backlog, CommittedStream, Outbound, wire_bytes
from migratory.server.accept import serve_tcp

log = logging.getLogger("migratory.cluster")

HEARTBEAT_SECONDS = 0.25
"""An idle link gets a heartbeat this often (a non-seed notices a stopped seed by it)."""

COALESCE_BYTES = 1 << 20
"""Queued frames written together in one write, up to about this many bytes (each
trio write costs ~50-100 us whatever it carries)."""

FORWARD_WINDOW = 8 * link.FORWARD_BYTES
"""Bytes of forwards (:func:`~cluster.coordination.request_bytes`) one link may have
submitted and not answered yet; past it, nothing more is read from that link until
the oldest is answered (the sender's writes wait: TCP carries the pressure back to
its publishers, whose queue is bounded by ClusterMaxPendingPublishes). Each forward
was a Raft command at once, however fast they came: a peer forwarding faster than
Raft commits filled pysyncobj's queue (100,000 commands of up to a frame each)."""
FORWARD_SETTLE_TIMEOUT = 10.0
"""Seconds after which a forward not answered stops counting (a callback lost: the
publishes of a forward that old have timed out for their clients anyway)."""

TakeForward = Callable[[str, Sequence[PublishRequest]], "trio.Event | None"]
"""Takes a peer's forward; returns an event set once it is answered (None: already)."""


class ForwardsInFlight:
    """One link's forwards submitted and not answered yet: at most ``window`` bytes of
    them before the link waits for the oldest (:data:`FORWARD_WINDOW`)."""

    def __init__(
        self, window: int = FORWARD_WINDOW, timeout: float = FORWARD_SETTLE_TIMEOUT
    ) -> None:
        self.window = window
        self.timeout = timeout
        self.bytes = 0
        self.waits = 0
        """Times the link stopped reading for want of room."""
        self._pending: deque[tuple[int, trio.Event, float]] = deque()

    def add(self, requests: Sequence[PublishRequest], settled: trio.Event | None) -> None:
        if settled is None or settled.is_set():
            return
        size = sum(request_bytes(r) for r in requests)
        self._pending.append((size, settled, trio.current_time()))
        self.bytes += size

    async def room(self) -> None:
        """Until the forwards in flight are within the window (the oldest answered, or
        older than ``timeout``)."""
        pending = self._pending
        while pending and pending[0][1].is_set():
            self.bytes -= pending.popleft()[0]
        if self.bytes > self.window:
            self.waits += 1
        while self.bytes > self.window:
            size, settled, taken = pending[0]
            with trio.move_on_at(taken + self.timeout):
                await settled.wait()
            pending.popleft()
            self.bytes -= size
            while pending and pending[0][1].is_set():
                self.bytes -= pending.popleft()[0]


def check_origins(peer: str, requests: Sequence[PublishRequest]) -> None:
    """A member forwards its own clients' publishes only: each request's origin is the
    peer's name and an incarnation (``host:port#hex``). Another member's origin would
    let the peer's publish take the place of that member's own publish of the same ref:
    the coordinator answers the real one as a repeat, with the impostor's position
    (``PUBLISH_OK``, and the real message never numbered)."""
    for request in requests:
        if request.origin.rpartition("#")[0] != peer:
            raise link.LinkViolation(
                f"a forwarded publish of origin {request.origin[:80]!r}, not one of {peer}'s",
                "origin")


@contextlib.contextmanager
def bind_error(bind: tuple[str, int]) -> Iterator[None]:
    """A cluster port that cannot be bound says which and the likely why (two members
    configured with one address on one host): the member does not start."""
    try:
        yield
    except OSError as exc:
        raise OSError(exc.errno, f"cluster link {bind[0]}:{bind[1]}: {exc.strerror} "
                      "(ClusterMemberBind / ClusterMemberListen: another member with this "
                      "address on this host?)") from exc


class PeerService:
    """Serves the cluster links other members open to this one."""

    def __init__(
        self,
        *,
        name: str,
        members: frozenset[str],
        password: str,
        tls: ClusterTls | None = None,
        stream: CommittedStream,
        take_forward: TakeForward | None,
        settings: MemberSettings | None = None,
        max_frame: int = link.MAX_FRAME,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    ) -> None:
        """``take_forward(peer, requests)`` submits a non-seed's publishes (seeds only);
        ``settings``: this member's, compared with each peer's (:mod:`cluster.agreement`);
        ``max_frame``: the largest frame taken from a peer
        (:func:`cluster.link.accepted_frame_limit` of the member's MaxFrameSize);
        ``max_message_size``: the member's MaxMessageSize, which a forwarded publish is
        checked against as a client's is (:mod:`cluster.link_publishes`)."""
        self.settings = settings
        self.publishes = PeerPublishes(max_message_size)
        self.max_frame = max_frame
        self.forward_window = FORWARD_WINDOW
        self.refusals = Repeats()
        self.handshakes = HandshakeGate()
        """Connections still proving the password (MAX_PENDING_HANDSHAKES at once)."""
        self.name = name
        self.members = members
        self.password = password
        self.tls = tls
        self.stream = stream
        self.take_forward = take_forward
        self.links_ended = 0

    async def run(
        self,
        bind: tuple[str, int],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async with trio.open_nursery() as nursery:
            with bind_error(bind):
                await nursery.start(
                    functools.partial(serve_tcp, host=bind[0], name="cluster link port",
                                      admit=self.handshakes.admit),
                    self.serve_peer,
                    bind[1],
                )
            task_status.started()

    async def serve_peer(self, socket_stream: trio.SocketStream) -> None:
        source = peer_host(socket_stream)  # now: a reset connection has none later
        channel = LinkChannel(
            secured(socket_stream, self.tls, server_side=True),
            role="accept",
            member=self.name,
            password=self.password,
            settings=self.settings,
            max_frame=self.max_frame,
        )
        peer = "?"
        try:
            accepted = await accept_link(channel, source=source, members=self.members,
                                         gate=self.handshakes, refusals=self.refusals)
            if accepted is None:
                return
            peer = accepted
            with self.handshakes.linked(peer):
                await self._serve(peer, channel)
        # except*: what ends the link comes out of _serve's nursery as a group
        except* link.LinkViolation as broke:
            self.handshakes.violated(peer, broke)
        except* (link.LinkError, trio.TooSlowError, OSError, EOFError,
                 trio.BrokenResourceError, trio.ClosedResourceError) as ended:
            log.info("link from %s ended: %s", peer, describe(ended))
        except* Exception:
            log.exception("link from %s failed; closing it (the member carries on)", peer)
        finally:
            self.links_ended += 1
            await channel.aclose()

    async def _serve(self, peer: str, channel: LinkChannel) -> None:
        send, receive = trio.open_memory_channel[Outbound](FOLLOWER_QUEUE)
        backlog = Backlog()
        forwards = ForwardsInFlight(self.forward_window)
        try:
            async with trio.open_nursery() as nursery:
                backlog.on_drop = nursery.cancel_scope.cancel  # too slow: the link ends
                nursery.start_soon(self._write, channel, receive, nursery.cancel_scope, backlog)
                while True:
                    await forwards.room()
                    op = await channel.receive()
                    if op is None:
                        break
                    self._on_op(peer, op, send, backlog, forwards)
                nursery.cancel_scope.cancel()
        finally:
            follower = self.stream.followers.get(peer)
            if follower is not None and follower.queue is send:
                self.stream.unfollow(peer)
            send.close()

    async def _write(
        self,
        channel: LinkChannel,
        frames: trio.MemoryReceiveChannel[Outbound],
        scope: trio.CancelScope,
        backlog: Backlog | None = None,
    ) -> None:
        """Write queued frames (those queued together in one write); a heartbeat when none
        came for HEARTBEAT_SECONDS, and one at least that often on a busy link too, once
        what is queued is written: heartbeats are what tells a non-seed this seed is ready
        (a link that never idled under load kept a non-seed "not ready" for as long as
        the load lasted when it had linked while this seed was not). Taking a frame and
        writing it are separate steps: a timeout never drops a frame."""
        backlog = Backlog() if backlog is None else backlog
        try:
            async with frames:
                last_beat = trio.current_time()
                while True:
                    item: Outbound | None = None
                    with trio.move_on_after(HEARTBEAT_SECONDS):
                        item = await frames.receive()
                    while item is not None:
                        item = await self._write_some(channel, frames, item, backlog)
                    # with nothing queued, every batch this seed applied is written (or
                    # held for a sync): the heartbeat's clsn is the follower's to reach
                    if (trio.current_time() - last_beat >= HEARTBEAT_SECONDS
                            and not frames.statistics().current_buffer_used):
                        await channel.send_encoded(self.stream.heartbeat())
                        last_beat = trio.current_time()
        except (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            scope.cancel()

    @staticmethod
    async def _write_some(
        channel: LinkChannel,
        frames: trio.MemoryReceiveChannel[Outbound],
        item: Outbound,
        backlog: Backlog,
    ) -> Outbound | None:
        """Write ``item`` and what queued after it, in one write up to COALESCE_BYTES
        (frames are length-prefixed: one write of several is the same byte stream); a
        cache sync a part at a time, each built just before it is written, so that the
        event loop runs between parts. Returns a sync met on the way, to write next."""
        backlog.taken(item)
        if isinstance(item, SyncFrames):
            for frame in item.frames():
                await channel.send_encoded(frame)
            return None
        data = [wire_bytes(item)]
        size = len(data[0])
        following: Outbound | None = None
        while size < COALESCE_BYTES:
            try:
                more = frames.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            if isinstance(more, SyncFrames):
                following = more  # taken from the backlog when written
                break
            backlog.taken(more)
            data.append(wire_bytes(more))
            size += len(data[-1])
        await channel.send_encoded(data[0] if len(data) == 1 else b"".join(data))
        return following

    def _on_op(
        self,
        peer: str,
        op: link.LinkOp,
        send: trio.MemorySendChannel[Outbound],
        backlog: Backlog,
        forwards: ForwardsInFlight,
    ) -> None:
        if isinstance(op, link.Replicate):
            following = self.stream.followers.get(peer)
            if following is not None and following.queue is send:  # each a capture
                raise link.LinkViolation("a second Replicate on one link", "replicate")
            self.stream.follow(peer, op.from_clsn, op.full, send, backlog)
        elif isinstance(op, link.Forward):
            if self.take_forward is None:
                raise link.LinkError("only seeds take forwarded publishes")
            if peer not in self.stream.followers:
                raise link.LinkError("Forward before Replicate")
            check_origins(peer, op.requests)
            requests, refused = self.publishes.forward(peer, op.requests, trio.current_time())
            for failed in refused:  # the origin's client gets its status, the link goes on
                self.stream.send_to(peer, failed)
            if requests:
                forwards.add(requests, self.take_forward(peer, requests))
        elif isinstance(op, link.SyncRequest):
            if backlog.syncs:  # each one a capture of every subject, and a sync written
                raise link.LinkViolation(
                    "a SyncRequest while a cache sync is still queued for it", "sync_request")
            answer = self.stream.sync_for(op.min_clsn)
            if isinstance(answer, link.SyncRefused):
                frame = link.encode_frame(answer)
                send.send_nowait(frame)
                backlog.queued(frame)
            else:  # a sync, built and written in parts by _write (counts no bytes)
                send.send_nowait(answer)
                backlog.queued(answer)
        else:
            raise link.LinkError(f"unexpected {type(op).__name__} from {peer}")
