"""A native session's Server-Sent Events side: starting a stream, its heartbeats, and
its catch-up paced by the socket. A mixin of :class:`~migratory.server.session.Session`,
kept apart so that each file reads alone (``Session.start_stream`` starts one).

A stream's backlog (what the hub answered its subscribes with, then the live events
that came meanwhile: :mod:`~migratory.server.sse_stream`) goes into the outbox only as
the socket drains: the writer calls :meth:`StreamSession.refill` before each write, so
the recovered messages never count against ClientMaxPendingBytes; the live events
waiting behind them do (:meth:`StreamSession.backlog_grew`). Each refill is work of the
event loop's turn (loop_turns.py): the writer waits for its turn first, and the refill
counts what it did in ``work_done`` as a WebSocket's answers do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from migratory.model.outbox import Outbox, SlowConsumer
from migratory.protocol import sse
from migratory.server.context import ServerContext
from migratory.server.run_output import RunOutput
from migratory.server.session_subscriptions import SLICE_UNITS, Subscriptions
from migratory.server.sse_stream import SseStream

if TYPE_CHECKING:
    from migratory.server.session_link import Link

# How long a browser waits before reconnecting a stream: RECONNECT_MS plus up to
# RECONNECT_JITTER_MS, drawn per stream, so the streams of a member that goes away do not
# all come back in the same millisecond (a burst of set-ups costs the member they come
# to full garbage collections: docs/benchmarks.md)
RECONNECT_MS = 1000
RECONNECT_JITTER_MS = 1000
# A stream catching up (sse_stream.py) gets its backlog encoded into its outbox as the
# socket drains: at most this many bytes per refill, and never past a quarter of its
# ClientMaxPendingBytes (the rest is the room of the live events meanwhile)
REFILL_BYTES = 65_536


class StreamSession(RunOutput):
    """Session methods of a Server-Sent Events stream (and, from :class:`RunOutput`,
    the hub's runs of encoded messages, a WebSocket's or a stream's)."""

    __slots__ = ("work_done",)

    work_done: int  # operations processed so far, as counted against a budget (Session)
    _ctx: ServerContext
    _link: Link
    _stream: SseStream | None
    _subscriptions: Subscriptions
    outbox: Outbox
    closing: bool
    aborted: bool

    def _send(self, frame: bytes) -> None:
        raise NotImplementedError  # Session: bounded, a slow consumer past the limit

    def _slow_consumer(self, why: SlowConsumer | str) -> None:
        raise NotImplementedError  # Session


    # --- a history made in slices (history_frame.py) ------------------------------------

    def hold_history(self, bound: int) -> bool:
        """Hold the place of a history frame of at most ``bound`` bytes in the outbox,
        made in later turns (:meth:`fill_history`); False if that cut the client off as
        a slow consumer (the frame queued whole would have)."""
        if self.closing or self.aborted:
            return False
        try:
            self.outbox.hold(bound)
        except SlowConsumer as exc:
            self._slow_consumer(exc)
            return False
        return True

    def fill_history(self, frame: bytes, *, write: bool = True) -> None:
        """The history frame, made: in its place (nothing if the outbox was dropped
        meanwhile); written as a frame queued then would be (``write``)."""
        if not self.outbox.holding:
            return
        full = self.outbox.fill(frame)
        if not write:
            return
        if full:
            self._link.flush_now()
        else:
            self._link.mark_dirty()

    @property
    def heartbeat_interval(self) -> float | None:
        """Seconds between heartbeats of an idle stream; None: not a stream."""
        return None if self._stream is None else float(self._ctx.config.sse_heartbeat_interval)

    def heartbeat(self) -> None:
        """An idle interval of a stream: a comment, or, for a stream whose catch-up moved
        nothing for two intervals in a row (its reader stopped), the cut-off."""
        stream = self._stream
        if stream is None:
            return
        if stream.stalled(self.outbox.pending_bytes):
            self._slow_consumer("catching up, nothing taken for two heartbeat intervals")
            return
        self._send(sse.comment())

    # --- a stream's catch-up (sse_stream.py) ------------------------------------------

    @property
    def catching_up(self) -> bool:
        """A stream's backlog waits (the writer calls :meth:`refill` as it drains)."""
        stream = self._stream
        return stream is not None and stream.catching_up

    @property
    def refilling(self) -> bool:
        """A stream's backlog waits, or a WebSocket's resume the hub settled (a lagging
        member caught up with it: hub_settle.py), and the session is not closing:
        :meth:`refill` it."""
        return (self.catching_up or self._subscriptions.settling) and not (
            self.closing or self.aborted)

    def resume_settled(self, subject: str) -> None:
        """The hub settled this WebSocket's resume of ``subject`` (it waited for this
        member to catch up): answered by :meth:`refill`, in the writer's turns of the
        loop, a slice at a time -- not by the hub, all of its clients at once."""
        self._subscriptions.settled(subject)
        self._link.mark_dirty()

    def refill(self, budget: int | None = None, now: float = 0.0) -> bool:
        """Top the outbox up from a stream's backlog (the socket took what it held), or
        answer a WebSocket's settled resumes, about ``budget`` units of work at most
        (counted in ``work_done``); True while more waits. Nothing waiting: False.
        ``now``: the server's clock (a resume's conflation starts then)."""
        stream = self._stream
        if stream is None and self._subscriptions.settling:
            if self.closing or self.aborted:
                return False
            self.work_done += self._subscriptions.answer_settled(
                now, SLICE_UNITS if budget is None else budget)
            return self._subscriptions.settling
        if stream is None or self.closing or self.aborted or not stream.catching_up:
            return False
        outbox = self.outbox
        room = min(REFILL_BYTES, (outbox.max_pending >> 2) - outbox.pending_bytes)
        if room <= 0:
            return True
        done = stream.work_done
        try:
            return stream.refill(room, budget)
        finally:
            self.work_done += stream.work_done - done

    def queue(self, frame: bytes) -> None:
        """An event of a stream's backlog (refill's caller writes it)."""
        self._send(frame)

    def backlog_grew(self, held: int) -> None:
        """A stream's backlog grew, ``held`` bytes of live events in it: past
        ClientMaxPendingBytes with what the outbox holds, a slow consumer; else the
        writer is told (it refills as the socket drains)."""
        if self.closing or self.aborted:
            return
        outbox = self.outbox
        if outbox.pending_bytes + held > outbox.max_pending:
            self._slow_consumer(
                f"catching up: {held} bytes of live events wait behind the backlog, "
                f"{outbox.pending_bytes} queued, ClientMaxPendingBytes {outbox.max_pending}"
            )
            return
        self._link.mark_dirty()

    def resumed(self, outcome: str) -> None:
        """A stream's subject resumed: migratory_resumes_total, as native."""
        stats = self._ctx.stats
        stats.count(stats.resumes, outcome)

    def _protocol_error(self, kind: str) -> None:
        """A client broke the protocol: counted by kind (GET /metrics)."""
        stats = self._ctx.stats
        stats.protocol_errors += 1
        stats.count(stats.protocol_error_kinds, kind)
