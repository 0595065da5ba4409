"""Leaving without costing a client anything: the drain on SIGTERM / SIGINT.

Kubernetes stops a pod (scale-down, rolling restart, eviction) by running its
``preStop`` hook and then sending SIGTERM; ``migratory serve`` then drains:

1. **No new clients.** ``/readyz`` answers 503 ("member is draining") and a new
   ``connect`` is closed with 1013 TRY_AGAIN_LATER, so the SDK goes elsewhere.
2. **Every publish gets its outcome here.** From now on a client's publish that wants
   an acknowledgement is refused at once with ``PUBLISH_FAILED`` ("member is
   draining") — definitely not published, so the client can publish it again on
   another member (the server's own records on ``/$`` subjects, an MQTT session's,
   go on). Publishes already submitted are settled: a client is told to
   leave only once each of its publishes has its ``PUBLISH_OK`` (or failure)
   queued before the close frame. No client is left not knowing whether a publish
   was acknowledged.
3. **Every client is told to go elsewhere** with 4502 DRAINED (a reconnect
   code) once its publishes are settled: the SDK reconnects to another member and
   resumes every subject from its position (``DATA_SYNC``). The code also says
   that every publish this member took has its status before the close frame, so
   the SDK reports a publish still waiting as not published (it arrived after the
   close was sent and was never read) -- provided it read every frame before the
   close: when its connection broke under a write first, trio-websocket dropped
   frames it had not handed over yet, and the SDK reports those publishes as
   outcome unknown (``SessionEnd.read_all``).
4. The server stops once the clients it had have left and every publish taken has
   its outcome (an HTTP ``POST /publish`` too), or after ``DrainTime`` seconds. A
   client that connects during the drain (every member draining at once: the others
   send theirs here) is refused by the readiness (1013) and not waited for. The drain
   acts on changes (a client gone: :meth:`Drain.left`, from the server's ``forget`` or
   once the client has everything and the end -- not its FIN, which a proxy or a lazy
   client may hold back: the connection's close linger, 5 s. A WebSocket's (ws, wss,
   MQTT over WebSocket) close frame in answer; an SSE stream or an MQTT connection,
   which have no answer, once its TCP acknowledged every byte and our FIN
   (``connection_linger``) --; a client's publishes settled), never by looking at
   every client again and again, and logs two lines however many clients it moves
   (each one's 4502 at DEBUG), the last naming by front end the clients it still
   waited for at DrainTime, the first few by name with where each was.

The drain owns two thin wrappers given to the server when it is built — the
readiness and the publish path — so nothing is patched while serving. The same
steps 2-3 move single clients for the rebalancer (:meth:`Drain.move`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from migratory.model.message import Message
from migratory.model.snapshot import RESERVED_PREFIX
from migratory.protocol import close_codes, ops
from migratory.server.context import PublishPath, PublishReply, publish_ok_status

log = logging.getLogger("migratory.drain")

DRAINING = "member is draining (shutting down): connect to another member"
MOVED = "member is moving this client to another member (rebalancing)"
REFUSED = ops.PUBLISH_ELSEWHERE
HELD_NAMED = 5  # clients the drain's last line names of those it still waited for


class DrainSession(Protocol):
    """What the drain needs of a client session."""

    @property
    def is_websocket(self) -> bool: ...

    @property
    def closing(self) -> bool: ...

    def close(self, code: int, reason: str) -> None: ...


class DrainConnection(Protocol):
    @property
    def session(self) -> Any: ...

    def flush(self) -> None: ...


@dataclass(frozen=True, slots=True)
class DrainReport:
    clients: int  # client sessions open at the start
    clients_told: int  # of those, closed with DRAINED by the drain
    clients_left: int  # of those, how many had gone
    clients_left_untold: int  # of those gone, how many went before they were told
    clients_cut: int  # of those, how many were still there at the end (DrainTime)
    clients_dropped: int  # of those gone and told, how many the member closed at the end
    # of the close linger (not reading its last bytes, or not answering the close)
    clients_remaining: int  # client sessions still connected when the drain ended
    publishes_settled: int  # outcomes delivered to clients after the drain began
    publishes_refused: int  # publishes refused because the member was draining
    seconds: float
    timed_out: bool


class _Settling:
    """One session's publishes still waiting for their outcome (a PublishReply proxy)."""

    __slots__ = ("_drain", "pending", "reply")

    def __init__(self, drain: Drain, reply: PublishReply) -> None:
        self._drain = drain
        self.reply = reply
        self.pending = 0

    def publish_result(self, status: ops.PublishStatus) -> None:
        self.pending -= 1
        self.reply.publish_result(status)
        self._drain._settled(self)

    def publish_ok(self, closure: str | None, subject: str, epoch: int, seq: int) -> None:
        self.publish_result(publish_ok_status(closure, subject, epoch, seq))

    def flush(self) -> None:
        self.reply.flush()


class DrainingPublishing:
    """The server's publish path while it may drain: counts each session's publishes in
    flight, and once draining refuses new ones with a definite ``PUBLISH_FAILED``.

    While nothing drains or moves, a path that settles each publish before ``submit``
    returns needs none of this: ``submit`` is then the inner path's own (one call less
    per publish); the drain puts the checks back (:meth:`gate`) before it starts or
    moves a client."""

    submit: Callable[[Message, PublishReply | None, float], None]

    def __init__(self, inner: PublishPath, drain: Drain) -> None:
        self._inner = inner
        self._drain = drain
        self.timings = inner.timings
        # a path that settles each publish before submit returns leaves nothing in flight:
        # no per-session count (its proxy was made and dropped for every publish, ~5 % of
        # the server's CPU at 10,000 subjects, py-spy)
        self._at_once = bool(getattr(inner, "settles_at_once", False))
        self.gate(drain.draining or bool(drain.moving))

    def gate(self, checked: bool) -> None:
        """Check every publish (``checked``) or, for a path that settles at once, step
        aside."""
        self.submit = self._checked if checked or not self._at_once else self._inner.submit

    def _checked(self, message: Message, reply: PublishReply | None, now: float) -> None:
        drain = self._drain
        if reply is None or message.subject.startswith(RESERVED_PREFIX):
            # nobody to answer, or the server's own record (an MQTT session's saved
            # positions, most needed as the client is sent away): never refused, and not
            # waited for (a busy session saves again as each save lands)
            self._inner.submit(message, reply, now)
            return
        if drain.draining or id(reply) in drain.moving:
            drain.refused += 1
            reply.publish_result(
                ops.PublishStatus(
                    ops.Status.PUBLISH_FAILED, message.closure, message.subject, None, REFUSED
                )
            )
            return
        if self._at_once:
            self._inner.submit(message, reply, now)
            return
        self._inner.submit(message, drain._track(reply), now)

    def statistics(self) -> dict[str, Any]:
        return self._inner.statistics()


class Drain:
    """The drain of one server: build it first, give the server :meth:`readiness` and
    :meth:`publishing`, and await :meth:`run` when the server is told to stop."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._draining = False
        self._paths: list[DrainingPublishing] = []
        self.refused = 0
        self.settled = 0
        self._settling: dict[int, _Settling] = {}  # id(session) -> its proxy
        self.moving: dict[int, DrainConnection] = {}  # id(session) -> its connection
        self.moved = 0
        # the drain's: the clients there at its start still open (id -> connection), those
        # told, those waiting for their publishes' statuses (id(session) -> connection) and
        # those whose publishes settled since (to tell); set at each such change
        self._open: dict[int, DrainConnection] = {}
        self._told: set[int] = set()
        self._dropped: set[int] = set()  # told, then dropped at the end of the close linger
        self._held: dict[int, DrainConnection] = {}
        self._ready: list[DrainConnection] = []
        self._changed = trio.Event()
        self._running: trio.Event | None = None  # set when the drain that runs ends
        self._report: DrainReport | None = None  # that drain's, once it ended

    @property
    def draining(self) -> bool:
        return self._draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self._draining = value
        self._gate()

    def _gate(self) -> None:
        checked = self._draining or bool(self.moving)
        for path in self._paths:
            path.gate(checked)

    def readiness(self, inner: Callable[[], str | None]) -> Callable[[], str | None]:
        def reason() -> str | None:
            return DRAINING if self.draining else inner()

        return reason

    def publishing(self, inner: PublishPath) -> DrainingPublishing:
        path = DrainingPublishing(inner, self)
        self._paths.append(path)
        return path

    def _track(self, reply: PublishReply) -> _Settling:
        proxy = self._settling.get(id(reply))
        if proxy is None:
            proxy = self._settling[id(reply)] = _Settling(self, reply)
        proxy.pending += 1
        return proxy

    def _settled(self, proxy: _Settling) -> None:
        if self.draining:
            self.settled += 1
        if proxy.pending <= 0:
            self._settling.pop(id(proxy.reply), None)
            if self.draining:
                held = self._held.pop(id(proxy.reply), None)
                if held is not None:
                    self._ready.append(held)
                self._changed.set()

    def unsettled(self, session: object) -> int:
        proxy = self._settling.get(id(session))
        return 0 if proxy is None else proxy.pending

    def move(self, connections: Iterable[DrainConnection]) -> None:
        """Send these clients to other members, each once its publishes are settled (its
        new publishes are refused meanwhile); call :meth:`close_settled` until done."""
        for connection in connections:
            self.moving[id(connection.session)] = connection
        self._gate()
        self.close_settled()

    def close_settled(self) -> int:
        """Close the moving clients whose publishes all have their status; how many."""
        closed = 0
        for key, connection in list(self.moving.items()):
            session = connection.session
            if session.closing:
                del self.moving[key]
            elif self.unsettled(session) == 0:
                del self.moving[key]
                session.close(close_codes.DRAINED.code, MOVED)
                connection.flush()
                closed += 1
        self.moved += closed
        self._gate()
        return closed

    def waits_for(self, connection: DrainConnection) -> bool:
        """Whether the drain waits for ``connection`` to leave (a client there at its
        start, not gone yet)."""
        return id(connection) in self._open

    def left(self, connection: DrainConnection) -> None:
        """``connection`` is gone (the server forgets it): the drain may be done."""
        if self._open.pop(id(connection), None) is not None:
            self._held.pop(id(connection.session), None)
            self._changed.set()

    def dropped(self, connection: DrainConnection) -> None:
        """``connection``, told, is being closed by the member at the end of its close
        linger (connection_linger.py): not taking its last bytes, or not answering the
        close frame -- not a client that left as told."""
        if id(connection) in self._open and id(connection) in self._told:
            self._dropped.add(id(connection))

    def _tell(self, connections: Iterable[DrainConnection]) -> None:
        """Close with 4502 each of ``connections`` whose publishes all have their status;
        hold the others until they do (:meth:`_settled`)."""
        for connection in connections:
            session = connection.session
            if session.closing:
                continue
            if self.unsettled(session):
                self._held[id(session)] = connection
                continue
            session.close(close_codes.DRAINED.code, DRAINING)
            connection.flush()
            self._told.add(id(connection))

    async def run(self, connections: Callable[[], Iterable[DrainConnection]]) -> DrainReport:
        """Drain the clients of ``connections()``; returns when those there at the start
        have all left (:meth:`left`) and no publish waits for its status, or after
        ``seconds``. The work is proportional to what happens -- a client told, a client
        gone, a publish settled --, not to the clients there at each turn (a newcomer's
        ``connect`` is refused by the readiness, 1013: it is not waited for).

        A second call while a drain runs waits for that one and returns its report: a
        SIGTERM during the drain of a seed leaving after its Raft stopped
        (``cluster/node.py``) started a second drain beside it, both telling the same
        clients and counting into one report each. If the running drain was cancelled,
        the second one drains."""
        while self._running is not None:
            await self._running.wait()
            if self._report is not None:
                return self._report
        self._running, self._report = trio.Event(), None
        try:
            self._report = await self._drain(connections)
            return self._report
        finally:
            self._running.set()
            self._running = None

    async def _drain(self, connections: Callable[[], Iterable[DrainConnection]]) -> DrainReport:
        started = trio.current_time()
        self.draining = True
        initial = [c for c in connections() if c.session.is_websocket]
        self._open = {id(c): c for c in initial}  # (holds them: no id reused)
        log.info("draining %d clients (DrainTime %g s)", len(initial), self.seconds)
        self._tell(initial)
        timed_out = True
        with trio.move_on_after(self.seconds):
            while self._open or self._settling:
                await self._changed.wait()
                self._changed = trio.Event()
                ready, self._ready = self._ready, []
                self._tell(ready)
            timed_out = False
        # (a client that answered the close is gone, whether or not its EOF came)
        remaining = sum(1 for c in connections() if c.session.is_websocket
                        and (id(c) in self._open or not c.session.closing))
        report = DrainReport(
            clients=len(initial),
            clients_told=len(self._told),
            clients_left=len(initial) - len(self._open),
            clients_left_untold=sum(1 for c in initial
                                    if id(c) not in self._open and id(c) not in self._told),
            clients_cut=len(self._open),
            clients_dropped=len(self._dropped - self._open.keys()),
            clients_remaining=remaining,
            publishes_settled=self.settled,
            publishes_refused=self.refused,
            seconds=round(trio.current_time() - started, 3),
            timed_out=timed_out,
        )
        log.info(
            "drained in %.1f s: %d clients told to reconnect elsewhere, %d still connected, "
            "%d publishes settled, %d refused; of the %d clients at the start %d left as "
            "told,%s %d on their own, %d cut at DrainTime%s%s",
            report.seconds, report.clients_told, report.clients_remaining,
            report.publishes_settled, report.publishes_refused, report.clients,
            report.clients_left - report.clients_left_untold - report.clients_dropped,
            (f" {report.clients_dropped} dropped at the close linger,"
             if report.clients_dropped else ""),
            report.clients_left_untold,
            report.clients_cut, " (DrainTime reached)" if timed_out else "",
            self._held_by(),
        )
        return report

    def _held_by(self) -> str:
        """The clients the drain still waited for at its end, by front end, and the first
        few of them by name with where each was (connection_linger.py's ``leaving``)."""
        if not self._open:
            return ""
        held = list(self._open.values())
        fronts: dict[str, int] = {}
        for connection in held:
            front = getattr(connection.session, "frontend", "?")
            fronts[front] = fronts.get(front, 0) + 1
        named = []
        for connection in held[:HELD_NAMED]:
            session = connection.session
            where = getattr(connection, "leaving", "") or (
                "not told: its publishes wait for their status"
                if id(session) in self._held else "not closed yet")
            describe = getattr(session, "describe", None)
            named.append(f"{describe() if describe else '?'} ({where})")
        more = f", {len(held) - HELD_NAMED} more" if len(held) > HELD_NAMED else ""
        counts = ", ".join(f"{n} {front}" for front, n in sorted(fronts.items()))
        return f"; held by {counts}: {'; '.join(named)}{more}"
