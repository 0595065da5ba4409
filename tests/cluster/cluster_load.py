"""Load for real-process cluster tests: a pipelined raw publisher and a raw subscriber.

Each is a thread over a raw WebSocket socket (our own sans-I/O codecs, as
``tests/server/rawclient.py``), bounded in time: it stops by itself after
``duration`` seconds at the latest. The publisher records every answer
(``PUBLISH_OK`` with its position, ``PUBLISH_FAILED`` with its reason) and the
publishes whose link dropped before an answer came; the subscriber records every
delivery, status and close, and resumes from its last positions on the next member
when it is sent away. :func:`delivery_problems` checks a subscriber against what was
acknowledged: exactly once, in order, no silent gap.
"""

from __future__ import annotations

import itertools
import os
import select
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from rawclient import RawClient

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import close_codes, ops
from migratory.protocol import websocket as ws

SUBJECTS = tuple(f"/load/s{i}" for i in range(4))
TICK = 0.01
"""Seconds between two bursts of the publisher (rate x TICK publishes each)."""
MAX_OUTSTANDING = 20_000
"""The publisher waits while this many publishes have no answer yet."""
DRAIN = 13.0
"""Seconds a stopped publisher waits for its last answers (the members' publish
timeout is 10 s)."""
LINK_ERRORS = (OSError, ConnectionError, AssertionError, TimeoutError, ValueError)


class _Link:
    """One raw client connection, read with ``select``: a receive timeout never disturbs
    the thread that sends."""

    def __init__(self, port: int, name: str) -> None:
        self.port = port
        self.client = RawClient(port, timeout=10.0)
        self.client.connect(name)
        self.lost = threading.Event()

    def send_ops(self, client_ops: Sequence[ops.ClientOp]) -> None:
        data = b"".join(
            ws.encode_masked_binary(ops.encode_client_op(op), os.urandom(4)) for op in client_ops
        )
        self.client.sock.sendall(data)

    def server_ops(self, wait: float) -> list[ops.ServerOp]:
        """What arrives within ``wait`` seconds; ConnectionError once the server closed."""
        sock, decoder = self.client.sock, self.client.decoder
        readable, _, _ = select.select([sock], [], [], wait)
        if readable:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("server closed the TCP connection")
            decoder.receive_data(chunk)
        out: list[ops.ServerOp] = []
        while (event := decoder.next_event()) is not None:
            if isinstance(event, ws.BinaryMessage):
                out.append(ops.decode_server_op(event.data))
            elif isinstance(event, ws.CloseReceived):
                raise Closed(event.code, event.reason, out)
        return out

    def close(self) -> None:
        self.client.close()


class Closed(ConnectionError):
    """The member closed the WebSocket (``code``, ``reason``), after ``ops``."""

    def __init__(self, code: int | None, reason: str, ops_before: list[ops.ServerOp]) -> None:
        super().__init__(f"closed {code} {reason}")
        self.code, self.reason, self.ops_before = code, reason, ops_before


class LoadPublisher(threading.Thread):
    """Publishes ``rate`` messages/s, pipelined with closures, round-robin over
    ``subjects`` (every other one retained), through the members at ``ports`` in turn
    (the next one when a link drops), for at most ``duration`` seconds."""

    def __init__(
        self,
        ports: Sequence[int],
        *,
        rate: float = 1500.0,
        duration: float = 30.0,
        subjects: Sequence[str] = SUBJECTS,
        tag: str = "p",
    ) -> None:
        super().__init__(daemon=True, name=f"publisher-{tag}")
        self.ports, self.rate, self.duration = list(ports), rate, duration
        self.subjects, self.tag = tuple(subjects), tag
        self.sent: dict[str, tuple[str, bytes]] = {}
        """closure -> (subject, content) of every publish sent."""
        self.acked: dict[str, Position] = {}
        self.failed: dict[str, str] = {}
        self.answers: dict[str, int] = {}
        """closure -> how many answers came for it (exactly one each, or a bug)."""
        self.unanswered: set[str] = set()
        """Sent on a link that dropped before their answer came (outcome unknown)."""
        self.not_published: set[str] = set()
        """Sent on a link the member closed with 4502 DRAINED before their answer came:
        not published (the close says every publish it took has its status before it:
        migratory/server/drain.py), as the SDK reports them."""
        self._drained = False
        self.links: list[int] = []
        """The member port of each link, in order."""
        self.errors: list[str] = []
        self._outstanding: set[str] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._drain_until = float("inf")
        self._counter = itertools.count()

    def stop(self) -> None:
        """Stop publishing and wait (at most :data:`DRAIN` s) for the last answers."""
        self._stopping.set()
        self.join(DRAIN + 5)
        assert not self.is_alive(), "publisher did not stop"

    def run(self) -> None:
        deadline = time.monotonic() + self.duration
        for port in itertools.cycle(self.ports):
            if self._stopping.is_set() or time.monotonic() > deadline:
                return
            try:
                link = _Link(port, f"load-{self.tag}")
            except LINK_ERRORS as exc:
                self.errors.append(f"connecting to {port}: {exc!r}")
                time.sleep(0.2)
                continue
            self.links.append(port)
            reader = threading.Thread(target=self._read, args=(link,), daemon=True)
            reader.start()
            try:
                self._publish(link, deadline)
            except LINK_ERRORS as exc:
                self.errors.append(f"publishing via {port}: {exc!r}")
                link.lost.set()
            self._drain_until = time.monotonic() + DRAIN
            reader.join()
            link.close()
            with self._lock:
                if self._drained:
                    self.not_published |= self._outstanding
                else:
                    self.unanswered |= self._outstanding
                self._outstanding.clear()
                self._drained = False

    def _publish(self, link: _Link, deadline: float) -> None:
        start, done = time.monotonic(), 0
        while not (self._stopping.is_set() or link.lost.is_set()) and time.monotonic() < deadline:
            with self._lock:
                room = MAX_OUTSTANDING - len(self._outstanding)
            due = min(int((time.monotonic() - start) * self.rate) - done, room)
            burst: list[ops.ClientOp] = []
            for _ in range(max(0, due)):
                n = next(self._counter)
                closure = f"{self.tag}{n}"
                subject = self.subjects[n % len(self.subjects)]
                content = f"{closure}|load".encode()
                burst.append(
                    ops.Publish(Message(subject, content, retained=n % 2 == 0, closure=closure))
                )
                self.sent[closure] = (subject, content)
                with self._lock:
                    self._outstanding.add(closure)
            done += len(burst)
            if burst:
                link.send_ops(burst)
            time.sleep(TICK)
        if time.monotonic() >= deadline:
            self._stopping.set()  # past the duration: stop for good

    def _read(self, link: _Link) -> None:
        try:
            while not link.lost.is_set():
                with self._lock:
                    drained = not self._outstanding
                if self._stopping.is_set() and (drained or time.monotonic() > self._drain_until):
                    return
                for op in link.server_ops(0.2):
                    self._on_op(op)
        except Closed as closed:
            for op in closed.ops_before:
                self._on_op(op)
            self._drained = closed.code == close_codes.DRAINED.code
            self.errors.append(f"link to {link.port}: {closed}")
        except LINK_ERRORS as exc:
            self.errors.append(f"link to {link.port}: {exc!r}")
        finally:
            link.lost.set()

    def _on_op(self, op: ops.ServerOp) -> None:
        if not isinstance(op, ops.PublishStatus) or op.closure is None:
            return
        with self._lock:  # the results are read from the test's thread meanwhile
            self._outstanding.discard(op.closure)
            self.answers[op.closure] = self.answers.get(op.closure, 0) + 1
            if op.status is ops.Status.PUBLISH_OK:
                assert op.position is not None
                self.acked[op.closure] = op.position
            else:
                self.failed[op.closure] = f"{op.status}: {op.reason}"

    # --- results -----------------------------------------------------------------------

    def acked_messages(self) -> dict[str, list[tuple[bytes, Position]]]:
        """Per subject: (content, position) of every acknowledged publish, by position."""
        out: dict[str, list[tuple[bytes, Position]]] = {s: [] for s in self.subjects}
        with self._lock:  # the publisher thread adds acknowledgements meanwhile
            acked = list(self.acked.items())
        for closure, position in acked:
            subject, content = self.sent[closure]
            out[subject].append((content, position))
        for acked in out.values():
            acked.sort(key=lambda item: (item[1].epoch, item[1].seq))
        return out

    def outstanding(self) -> set[str]:
        """The publishes sent and not answered yet, now (a copy)."""
        with self._lock:
            return set(self._outstanding)

    def wait_acked(self, count: int, timeout: float) -> None:
        """Until ``count`` publishes are acknowledged in all (TimeoutError after
        ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while len(self.acked) < count:
            if time.monotonic() > deadline or not self.is_alive():
                raise TimeoutError(
                    f"{len(self.acked)} of {count} acknowledged; last errors {self.errors[-3:]}"
                )
            time.sleep(0.05)

    def summary(self) -> str:
        return (
            f"{len(self.sent)} sent, {len(self.acked)} acknowledged, {len(self.failed)} failed,"
            f" {len(self.unanswered)} unanswered, {len(self.not_published)} not published (a "
            f"drain's close), links via {self.links}"
        )


@dataclass(frozen=True, slots=True)
class Received:
    """One thing a subscriber received, with the link (session) it came on."""

    session: int
    at: float
    op: ops.ServerOp


class LoadSubscriber(threading.Thread):
    """Subscribes to ``subjects`` on the members at ``ports`` in turn; when a member
    sends it away (or its link drops) it resumes every subject from its last position
    on the next one. Stops after ``duration`` seconds at the latest."""

    def __init__(
        self,
        ports: Sequence[int],
        *,
        duration: float = 40.0,
        subjects: Sequence[str] = SUBJECTS,
        positions: dict[str, Position] | None = None,
        tag: str = "s",
        retry: float = 0.2,
    ) -> None:
        """``retry``: seconds between two attempts to connect."""
        super().__init__(daemon=True, name=f"subscriber-{tag}")
        self.retry = retry
        self.ports, self.duration, self.subjects, self.tag = list(ports), duration, subjects, tag
        self.positions: dict[str, Position] = dict(positions or {})
        """The last position seen of each subject (where a resume starts)."""
        self.started: dict[str, Position] = {}
        """Each subject's position when first subscribed (its ``SUBSCRIBE_ALLOW``)."""
        self.received: list[Received] = []
        self.links: list[int] = []
        self.closes: list[str] = []
        self.errors: list[str] = []
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()
        self.join(5)
        assert not self.is_alive(), "subscriber did not stop"

    def run(self) -> None:
        deadline = time.monotonic() + self.duration
        for port in itertools.cycle(self.ports):
            if self._stopping.is_set() or time.monotonic() > deadline:
                return
            try:
                link = _Link(port, f"load-{self.tag}")
                link.send_ops([ops.Subscribe(tuple(
                    ops.SubscriptionRequest(s, position=self.positions.get(s))
                    for s in self.subjects
                ))])
            except LINK_ERRORS as exc:
                self.errors.append(f"connecting to {port}: {exc!r}")
                time.sleep(self.retry)
                continue
            self.links.append(port)
            try:
                while not self._stopping.is_set() and time.monotonic() < deadline:
                    for op in link.server_ops(0.1):
                        self._on_op(op)
            except Closed as closed:
                for op in closed.ops_before:
                    self._on_op(op)
                self.closes.append(f"{port}: {closed.code} {closed.reason}")
            except LINK_ERRORS as exc:
                self.errors.append(f"link to {port}: {exc!r}")
            finally:
                link.close()

    def _on_op(self, op: ops.ServerOp) -> None:
        self.received.append(Received(len(self.links), time.monotonic(), op))
        if isinstance(op, ops.Deliver):
            for message in op.messages:
                if message.type is not MessageType.SNAPSHOT:
                    self.positions[message.subject] = message.position
        elif isinstance(op, ops.SubjectStatus):
            if op.status is ops.Status.SUBSCRIBE_ALLOW:
                start = op.position or self.positions.get(op.subject)
                if start is not None:
                    self.started.setdefault(op.subject, start)
            if op.position is not None and op.status is not ops.Status.SUBSCRIBE_DENY:
                self.positions[op.subject] = op.position

    def wait_subscribed(self, timeout: float) -> None:
        """Until every subject has had its ``SUBSCRIBE_ALLOW``."""
        deadline = time.monotonic() + timeout
        while set(self.subjects) - set(self.started):
            if time.monotonic() > deadline or not self.is_alive():
                raise TimeoutError(f"{self.tag} not subscribed: errors {self.errors[-3:]}, "
                                   f"closes {self.closes[-3:]}")
            time.sleep(0.05)

    # --- results -----------------------------------------------------------------------

    def messages(self, since: float = 0.0, until: float = float("inf")) -> list[Message]:
        """What was delivered, in order (received at ``since`` or later and before
        ``until``, ``time.monotonic``)."""
        return [
            m
            for r in list(self.received)
            if since <= r.at < until and isinstance(r.op, ops.Deliver)
            for m in r.op.messages
        ]

    def statuses(self, *wanted: ops.Status) -> list[ops.SubjectStatus]:
        return [
            r.op
            for r in list(self.received)
            if isinstance(r.op, ops.SubjectStatus) and (not wanted or r.op.status in wanted)
        ]

    def wait_statuses(self, count: int, *wanted: ops.Status, timeout: float) -> None:
        """Until ``count`` statuses of the ``wanted`` kinds have arrived."""
        deadline = time.monotonic() + timeout
        while len(self.statuses(*wanted)) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.tag}: {self.statuses()[-5:]}")
            time.sleep(0.05)

    def wait_for(self, contents: set[bytes], timeout: float) -> None:
        """Until every one of ``contents`` has been delivered (TimeoutError after
        ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while True:
            missing = contents - {m.content for m in self.messages()}
            if not missing:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(missing)} of {len(contents)} not delivered to {self.tag} "
                    f"(links {self.links}, closes {self.closes[-3:]}, errors {self.errors[-3:]})"
                )
            time.sleep(0.1)


def delivery_problems(
    received: Sequence[Message],
    acked: dict[str, list[tuple[bytes, Position]]],
    after: dict[str, Position] | None = None,
) -> list[str]:
    """What is wrong with ``received`` (one subscriber's deliveries, in order) against the
    ``acked`` publishes (those after ``after[subject]``, where the subscriber started, if
    given): an acknowledged message missing or at another position, a position delivered
    twice, out of order, a gap in a lineage, two contents at one position, or one content
    at two positions (a publish numbered twice). Snapshots are not counted (they repeat a
    message on purpose)."""
    problems: list[str] = []
    by_subject: dict[str, list[Message]] = {}
    for message in received:
        if message.type is not MessageType.SNAPSHOT:
            by_subject.setdefault(message.subject, []).append(message)
    for subject, messages in by_subject.items():
        last: Position | None = None
        seen: dict[Position, bytes] = {}
        for m in messages:
            position = m.position
            if position in seen:
                what = "delivered twice" if seen[position] == m.content else "two contents"
                problems.append(f"{subject} {position}: {what}")
                continue
            seen[position] = m.content
            if last is not None and position.epoch == last.epoch:
                if position.seq < last.seq:
                    problems.append(f"{subject} {position} after {last}: out of order")
                elif position.seq > last.seq + 1:
                    problems.append(f"{subject} {position} after {last}: gap")
            last = position
    for subject, messages in by_subject.items():
        positions: dict[bytes, Position] = {}
        for m in messages:
            first = positions.setdefault(m.content, m.position)
            if first != m.position:
                problems.append(f"{subject} {m.content!r}: numbered twice, at {first} and "
                                f"{m.position}")
    for subject, messages_acked in acked.items():
        got = {
            m.content: m.position for m in by_subject.get(subject, [])
        }
        start = (after or {}).get(subject)
        for content, position in messages_acked:
            if start is not None and position.epoch == start.epoch and position <= start:
                continue
            if content not in got:
                problems.append(f"{subject} {position} {content!r}: acknowledged, not delivered")
            elif got[content] != position:
                problems.append(
                    f"{subject} {content!r}: acknowledged at {position}, delivered at "
                    f"{got[content]}"
                )
    return problems
