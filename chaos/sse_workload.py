"""Server-Sent Events subscribers of the workload (kind ``sse``): ``GET /events`` streams
read as a browser's ``EventSource`` reads them.

Each is a raw-socket HTTP client (trio TCP; h11 frames the response; the body is parsed
by the event-stream rules of the HTML standard, :class:`EventStream`, sans-I/O) with one
stream of its plan's subjects (several of at most :data:`STREAM_SUBJECTS` each when it
has more), on a member's client port (behind the member's client proxy, so client-link
faults hit it). Like ``EventSource``:

- the last event id is the ``id`` of the last *dispatched* event (an event cut by the
  connection's end is discarded, its id with it); it is sent as ``Last-Event-ID`` on the
  next connection, which goes to the next member (a browser reconnects to the same URL,
  and the load balancer picks the member);
- the pause before a reconnection is the stream's ``retry`` (the server draws 1-2 s),
  :data:`FIRST_RETRY` before any; an answer other than 200 (a member not ready: 503) ends
  an ``EventSource`` for good, so this client does what docs/http.md tells a page to do:
  open a new one with the last id after :data:`REFUSED_PAUSE`.

One thing a plain ``EventSource`` lacks: a stream that stays silent for ``stall`` s (the
runner gives the members heartbeats every second: ``SseHeartbeatInterval``) is taken for
dead and reconnected, as a page's watchdog does; without it, a paused or black-holed
member would hold the stream until the fault ends.

What is recorded (:class:`SseRecorder`): every ``message`` event as a ``deliveries`` row
of kind ``sse`` (its subject, epoch, seq and type from the event's data, the msg_id from
its content); ``subscribe`` / ``deny`` / ``sync`` / ``resync`` events as the
``SUBSCRIBE_ALLOW`` / ``SUBSCRIBE_DENY`` / ``DATA_SYNC`` / ``DATA_RESYNC`` subscription
rows with the position they carry; ``SERVER_UP`` when a 200 head comes (then
``subscribed`` per subject), ``SERVER_DOWN`` when that connection ends. The checker holds
the kind to the sdk / raw rules.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from urllib.parse import urlencode

import h11
import trio

from chaos.plan import SubscriberPlan
from chaos.schedule import member
from chaos.workload import Workload, parse_id, starts_anew

KIND = "sse"
STREAM_SUBJECTS = 100  # GET /events takes at most 100 subjects (docs/http.md)
HEARTBEAT = 1  # s: SseHeartbeatInterval of the members of a run with SSE subscribers
FIRST_RETRY = 1.0  # s before a reconnection until a stream has said its retry
REFUSED_PAUSE = 1.0  # s before a new stream after an answer other than 200
RETRY_BOUNDS = (0.1, 5.0)  # a stream's retry, in seconds, kept within these
READ_SIZE = 65536
STATUS_ROWS = {
    "subscribe": "SUBSCRIBE_ALLOW",
    "deny": "SUBSCRIBE_DENY",
    "sync": "DATA_SYNC",
    "resync": "DATA_RESYNC",
}


def stall_after(heartbeat: float) -> float:
    """Seconds of silence after which a stream with heartbeats every ``heartbeat`` s is
    taken for dead (two heartbeats missed, and a second)."""
    return 2 * heartbeat + 1


@dataclass(frozen=True, slots=True)
class Head:
    status: int


@dataclass(frozen=True, slots=True)
class Event:
    """A dispatched event; ``last_id``: the stream's last event id once it was."""

    type: str
    data: str
    last_id: str


@dataclass(frozen=True, slots=True)
class Ended:
    reason: str


Item = Head | Event | Ended


class EventStream:
    """One ``GET /events`` exchange, sans-I/O: :meth:`request` gives the bytes to send,
    :meth:`receive_data` takes what arrives (``b""``: the connection ended) and returns
    the head, the dispatched events and the end. ``last_id`` and ``retry`` (seconds, or
    None) are the ``EventSource``'s: what its next connection uses."""

    def __init__(self, last_id: str = "") -> None:
        self.last_id = last_id
        self.retry: float | None = None
        self.ended = False
        self._http = h11.Connection(h11.CLIENT)
        self._status: int | None = None
        self._pending = b""  # body bytes after the last complete line
        self._data: list[str] = []
        self._type = ""
        self._id = last_id  # the last event ID buffer (kept across events, as browsers do)

    def request(self, host: str, subjects: list[str], client: str) -> bytes:
        query = urlencode([("subject", s) for s in subjects] + [("client", client)])
        headers = [("Host", host), ("Accept", "text/event-stream"), ("Cache-Control", "no-cache")]
        if self.last_id:
            headers.append(("Last-Event-ID", self.last_id))
        head = self._http.send(h11.Request(method="GET", target=f"/events?{query}",
                                           headers=headers))
        return (head or b"") + (self._http.send(h11.EndOfMessage()) or b"")

    def receive_data(self, data: bytes) -> list[Item]:
        if self.ended:
            return []
        out: list[Item] = []
        try:
            self._http.receive_data(data)
            for _ in range(1_000_000):  # bounded for the linter: one event per turn
                event = self._http.next_event()
                if event is h11.NEED_DATA or event is h11.PAUSED:
                    break
                if isinstance(event, h11.Response):
                    self._status = event.status_code
                    out.append(Head(event.status_code))
                elif isinstance(event, h11.Data) and self._status == 200:
                    out += self._body(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                    self.ended = True
                    out.append(Ended("closed by the server"))
                    break
        except h11.RemoteProtocolError as exc:
            self.ended = True
            out.append(Ended(f"bad HTTP: {exc}"))
        if data == b"" and not self.ended:
            self.ended = True
            out.append(Ended("closed by the server"))
        return out

    def _body(self, data: bytes) -> list[Item]:
        """Complete lines (CR LF, LF or CR ends one) into events; a CR at the very end
        waits for the next bytes (it may be the first half of CR LF)."""
        buf = self._pending + data
        out: list[Item] = []
        start = 0
        for _ in range(len(buf) + 1):
            cr, lf = buf.find(b"\r", start), buf.find(b"\n", start)
            ends = [i for i in (cr, lf) if i >= 0]
            if not ends:
                break
            end = min(ends)
            if end == cr and end + 1 == len(buf):
                break  # a lone CR at the end: wait for what follows
            step = 2 if end == cr and buf[end + 1 : end + 2] == b"\n" else 1
            event = self._line(buf[start:end].decode("utf-8", "replace"))
            if event is not None:
                out.append(event)
            start = end + step
        self._pending = buf[start:]
        return out

    def _line(self, line: str) -> Event | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment (heartbeat)
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._type = value
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry = min(max(int(value) / 1000, RETRY_BOUNDS[0]), RETRY_BOUNDS[1])
        return None

    def _dispatch(self) -> Event | None:
        self.last_id = self._id
        data, kind = "\n".join(self._data), self._type or "message"
        self._data, self._type = [], ""
        return Event(kind, data, self.last_id) if data else None


class SseRecorder:
    """The history of one SSE subscriber (no I/O: tested alone)."""

    def __init__(self, w: Workload, spec: SubscriberPlan) -> None:
        self.w, self.spec = w, spec
        self.closes: list[str] = []  # the close events' reasons (code: reason)
        w.seen.setdefault(spec.name, set())

    def _sub(self, subject: str | None, event: str, member_name: str | None, time: float,
             epoch: int | None = None, seq: int | None = None) -> None:
        if event == "subscribed":
            self.w.subscribed_at.setdefault(self.spec.name, time)
        elif starts_anew(event, subject, epoch):
            self.w.resynced[(self.spec.name, str(subject))] = time  # (Workload.drained)
        self.w.h.write("subscriptions", subscriber=self.spec.name, kind=KIND, subject=subject,
                       event=event, member=member_name, epoch=epoch, seq=seq, time=time)

    def up(self, subjects: list[str], member_name: str, time: float) -> None:
        """A 200 head: the stream is subscribed (its events follow)."""
        self._sub(None, "SERVER_UP", member_name, time)
        for s in subjects:
            self._sub(s, "subscribed", member_name, time)

    def down(self, member_name: str, reason: str, time: float) -> None:
        self._sub(None, "SERVER_DOWN", member_name, time)
        self.w.say(f"sse {self.spec.name} lost {member_name} ({reason[:80]})")

    def event(self, event: Event, member_name: str, time: float) -> None:
        try:
            data = json.loads(event.data)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            self.w.say(f"sse {self.spec.name}: unreadable {event.type} event {event.data[:80]!r}")
            return
        if event.type == "message":
            self._message(data, member_name, time)
        elif event.type in STATUS_ROWS:
            self._sub(data.get("subject"), STATUS_ROWS[event.type], member_name, time,
                      data.get("epoch"), data.get("seq"))
        elif event.type == "close":
            self.closes.append(f"{data.get('code')}: {data.get('reason')}")

    def _message(self, data: dict[str, object], member_name: str, time: float) -> None:
        content = data.get("content")
        if isinstance(content, str):
            raw = content.encode()
        else:
            raw = base64.b64decode(str(data.get("content_base64") or ""))
        msg_id = parse_id(raw)
        if msg_id:
            self.w.seen[self.spec.name].add(msg_id)
        self.w.stats["deliveries"] += 1
        self.w.last_delivery = time
        self.w.h.write(
            "deliveries", subscriber=self.spec.name, kind=KIND, member=member_name,
            subject=data.get("subject"), epoch=data.get("epoch"), seq=data.get("seq"),
            msg_id=msg_id, type=data.get("type"), time=time,
        )


async def _connection(rec: SseRecorder, stream: EventStream, port: int, mname: str,
                      subjects: list[str], stall: float, ready: trio.Event) -> int | None:
    """One stream until it ends; the answer's status (None: no answer)."""
    w, status, closes = rec.w, None, len(rec.closes)
    reason = "closed by the server"
    try:
        with trio.fail_after(stall):
            tcp = await trio.open_tcp_stream("127.0.0.1", port)
        async with tcp:
            await tcp.send_all(stream.request(f"127.0.0.1:{port}", subjects, rec.spec.name))
            while not stream.ended:
                data = b""
                with trio.move_on_after(stall) as idle:
                    data = await tcp.receive_some(READ_SIZE)
                if idle.cancelled_caught:
                    reason = f"silent for {stall:.0f} s"
                    break
                for item in stream.receive_data(data):
                    if isinstance(item, Head):
                        status = item.status
                        if status == 200:
                            rec.up(subjects, mname, w.h.now())
                            ready.set()
                    elif isinstance(item, Event):
                        rec.event(item, mname, w.h.now())
                    else:
                        reason = item.reason
    except (OSError, trio.BrokenResourceError, trio.TooSlowError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
    if status == 200:
        if len(rec.closes) > closes:
            reason += f" (close {rec.closes[-1]})"
        rec.down(mname, reason, w.h.now())
    elif status is not None:
        w.say(f"sse {rec.spec.name}: {mname} answered {status}")
    return status


async def _stream(rec: SseRecorder, subjects: list[str], ports: list[int], stall: float,
                  ready: trio.Event) -> None:
    """One ``EventSource`` of ``subjects``, reconnected to the next member each time."""
    idx, last_id, retry = rec.spec.prefer, "", FIRST_RETRY
    for _ in range(1_000_000):
        stream = EventStream(last_id)
        status = await _connection(rec, stream, ports[idx], member(idx), subjects, stall, ready)
        last_id = stream.last_id
        retry = stream.retry if stream.retry is not None else retry
        idx = (idx + 1) % len(ports)
        await trio.sleep(retry if status in (None, 200) else REFUSED_PAUSE)


async def sse_subscriber(w: Workload, spec: SubscriberPlan, ready: trio.Event,
                         ports: list[int], stall: float) -> None:
    """``ports[i]``: member i's client port (as the clients reach it); ``ready`` is set
    once every stream of the subscriber got its first 200."""
    rec = SseRecorder(w, spec)
    chunks = [list(spec.subjects[i : i + STREAM_SUBJECTS])
              for i in range(0, len(spec.subjects), STREAM_SUBJECTS)]
    readies = [trio.Event() for _ in chunks]
    async with trio.open_nursery() as nursery:
        for chunk, up in zip(chunks, readies, strict=True):
            nursery.start_soon(_stream, rec, chunk, ports, stall, up)
        for up in readies:
            await up.wait()
        ready.set()
