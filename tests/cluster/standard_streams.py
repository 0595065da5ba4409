"""Real-process streams for Standard-mode combination tests: publishers that ride out
their member's restarts, subscribers that fail over to another member, and the check
that every acknowledged message a subscriber did not get was announced in its window
(docs/chaos.md, "Standard mode": a ``DATA_RESYNC`` after the last message of its sender
the subscriber got before it, and before the first it got after it)."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from cluster_fixture import LocalCluster

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from rawclient import RawClient

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops

RESYNC = "resync"
FAILOVER = "failover"


@dataclass(frozen=True)
class Got:
    """A message a subscriber got: its sender (publisher name) and number there."""

    sender: str
    number: int
    position: Position
    kind: MessageType


class StreamPublisher(threading.Thread):
    """Publishes ``<name>:<n>`` to ``subject`` through member ``index`` at ``rate`` a
    second (on a schedule, no catching up after a stall) until stopped, reconnecting to
    the same member while it restarts. ``acked``: the numbers answered PUBLISH_OK (one
    whose answer was lost with its member is owed to no one: not acknowledged)."""

    def __init__(self, cluster: LocalCluster, index: int, name: str, subject: str,
                 rate: float, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.cluster, self.index, self.name, self.subject = cluster, index, name, subject
        self.pause, self.stop = 1 / rate, stop
        self.acked: list[int] = []
        self.unknown = 0
        self.seconds = 0.0  # from its first publish to its last

    def run(self) -> None:
        client: RawClient | None = None
        number = 0
        started = due = time.monotonic()
        deadline = started + 120
        while not self.stop.is_set() and time.monotonic() < deadline:
            if client is None:
                try:
                    client = RawClient(self.cluster.port(self.index), timeout=5)
                    client.connect(f"pub-{self.name}")
                except (OSError, AssertionError, TimeoutError, ConnectionError):
                    client = None
                    time.sleep(0.1)
                    continue
            try:
                status = client.publish(Message(self.subject, f"{self.name}:{number}".encode(),
                                                closure=str(number)))
            except (OSError, AssertionError, TimeoutError, ConnectionError):
                self.unknown += 1  # its member went away: acknowledged or not, unknown
                client.close()
                client = None
            else:
                if status.status is ops.Status.PUBLISH_OK:
                    self.acked.append(number)
            number += 1
            due = max(due + self.pause, time.monotonic() - 0.1)  # (no burst after a stop)
            time.sleep(max(0.0, due - time.monotonic()))
        self.seconds = time.monotonic() - started
        if client is not None:
            client.close()


class StreamSubscriber(threading.Thread):
    """Subscribes to ``subject`` on the first of ``members``; when its connection ends
    (the member drained or killed), resumes from its last position on the next member
    that answers. ``events``: what it got, in order -- :class:`Got`, ``RESYNC`` (a
    ``DATA_RESYNC``), ``FAILOVER``."""

    def __init__(self, cluster: LocalCluster, members: list[int], subject: str,
                 stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.cluster, self.members, self.subject, self.stop = cluster, members, subject, stop
        self.events: list[Got | str] = []
        self.position: Position | None = None
        self.subscribed = threading.Event()

    def run(self) -> None:
        turn = 0
        deadline = time.monotonic() + 120
        while not self.stop.is_set() and time.monotonic() < deadline:
            member = self.members[turn % len(self.members)]
            turn += 1
            try:
                client = RawClient(self.cluster.port(member), timeout=5)
                client.connect(f"sub-{self.members[0]}")
            except (OSError, AssertionError, TimeoutError, ConnectionError):
                time.sleep(0.1)
                continue
            if self.position is not None:
                self.events.append(FAILOVER)
            client.subscribe(self.subject, position=self.position)
            try:
                self._receive(client)
            except (OSError, AssertionError, ConnectionError):
                pass  # its member went away: the next one
            finally:
                client.close()

    def _receive(self, client: RawClient) -> None:
        while not self.stop.is_set():
            try:
                op = client.recv_op(timeout=0.3)
            except TimeoutError:
                continue
            if isinstance(op, ops.SubjectStatus):
                if op.status is ops.Status.DATA_RESYNC:
                    self.events.append(RESYNC)
                elif op.status is ops.Status.SUBSCRIBE_ALLOW:
                    self.subscribed.set()
            elif isinstance(op, ops.Deliver):
                for message in op.messages:
                    sender, number = message.content.decode().split(":")
                    self.events.append(Got(sender, int(number), message.position,
                                           message.type))
                    self.position = message.position

    def got(self) -> list[Got]:
        return [e for e in self.events if isinstance(e, Got)]


@dataclass
class Check:
    """What breaks Standard's promise in one subscriber's events."""

    unannounced: list[str] = field(default_factory=list)
    """A sender's acknowledged messages skipped with no ``DATA_RESYNC`` in the window."""
    repeated: list[str] = field(default_factory=list)
    """A sender's message at or before the last one of it, on one lineage."""
    positions: list[str] = field(default_factory=list)
    """A position out of step in its epoch (a hole, a repeat, a reorder)."""
    missing_at_end: list[str] = field(default_factory=list)
    """Acknowledged after the last one got of its sender, never got nor announced."""

    def ok(self) -> bool:
        return not (self.unannounced or self.repeated or self.positions
                    or self.missing_at_end)


def check(events: list[Got | str], acked: dict[str, list[int]]) -> Check:
    """Hold ``events`` to Standard's rules for the messages ``acked`` (per sender)."""
    result = Check()
    last: dict[str, int] = dict.fromkeys(acked, -1)
    announced: dict[str, bool] = dict.fromkeys(acked, False)
    owed = {sender: set(numbers) for sender, numbers in acked.items()}
    epochs: dict[int, int] = {}
    for event in events:
        if event == RESYNC:
            announced = dict.fromkeys(announced, True)
            continue
        if not isinstance(event, Got) or event.kind is MessageType.SNAPSHOT:
            continue
        seq = epochs.get(event.position.epoch)
        if seq is not None and event.position.seq != seq + 1:
            result.positions.append(f"{event.position} after seq {seq}")
        epochs[event.position.epoch] = event.position.seq
        sender, number = event.sender, event.number
        if number <= last[sender]:
            if not announced[sender]:
                result.repeated.append(f"{sender}:{number} after {sender}:{last[sender]}")
        else:
            skipped = sorted(n for n in owed[sender] if last[sender] < n < number)
            if skipped and not announced[sender]:
                result.unannounced.append(f"{sender}:{skipped} before {sender}:{number}")
        last[sender], announced[sender] = number, False
    for sender, numbers in acked.items():
        after = [n for n in numbers if n > last[sender]]
        if after and not announced[sender]:
            result.missing_at_end.append(f"{sender}:{after}")
    return result


def wait_until_got(subscribers: list[StreamSubscriber], publishers: list[StreamPublisher],
                   timeout: float = 20) -> None:
    """Until every subscriber got each publisher's last acknowledged message (or
    ``timeout``): what is still on its way when the load stops."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(any(g.sender == p.name and g.number == p.acked[-1] for g in s.got())
               for s in subscribers for p in publishers if p.acked):
            return
        time.sleep(0.1)


def resyncs(subscriber: StreamSubscriber) -> int:
    return sum(e == RESYNC for e in subscriber.events)
