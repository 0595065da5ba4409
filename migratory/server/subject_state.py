"""Everything the hub knows about one subject: its position (epoch, seq), cache and
snapshot, and its subscribers of each kind -- native sessions, Server-Sent Events
streams, conflated subscriptions, resumes waiting for this member to catch up, and
whole-message sinks (MQTT sessions)."""

from __future__ import annotations

from typing import NamedTuple

from migratory.model.cache import SubjectCache
from migratory.model.conflation import Conflator
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.server.format_sink import AnySink, FormatSink, MessageSink, Sink


class WaitingResume(NamedTuple):
    """A resume that waits until this member reaches the client's ``position``."""

    position: Position
    conflation_ms: int
    snapshot: bool = False
    """The resume asked for the snapshot as of ``position`` (``SubscriptionRequest``)."""
    history: int = 0
    """The resume asked for the history as of ``position`` (``SubscriptionRequest``)."""


class SubjectState:
    """Everything the hub knows about one subject."""

    __slots__ = (
        "cache", "conflated", "epoch", "formatted", "listeners", "made", "seq", "settle_at",
        "settle_epoch", "settling", "snapshot", "subject", "subscribers", "waiting",
    )

    def __init__(self, subject: str, epoch: int, cache: SubjectCache, made: int = 0) -> None:
        self.subject = subject
        self.epoch = epoch
        self.made = made
        """The hub's moment this state was made at (``Hub.holdings_made``)."""
        self.seq = 0
        self.cache = cache
        self.snapshot: Message | None = None
        # dicts used as insertion-ordered sets: deterministic fan-out order
        self.subscribers: dict[Sink, None] = {}
        self.formatted: dict[FormatSink, None] = {}  # SSE streams: their own encoding
        self.conflated: dict[AnySink, Conflator] = {}
        # resumes from a position this member has not reached yet (it lags the cluster)
        self.waiting: dict[AnySink, WaitingResume] = {}
        # the waiting cannot settle before ``seq`` reaches this while ``epoch`` is
        # ``settle_epoch`` (hub_settle.py: no look at them per message applied)
        self.settle_at = 0
        self.settle_epoch = epoch
        # resumes this member caught up with, handed to their sessions to answer in their
        # own turns of the loop (hub_settle.py)
        self.settling: dict[AnySink, WaitingResume] = {}
        # sinks of whole messages subscribed to exactly this subject -> granted QoS
        self.listeners: dict[MessageSink, int] = {}

    @property
    def position(self) -> Position:
        return Position(self.epoch, self.seq)

    @property
    def sinks(self) -> int:
        """Subscriptions to exactly this subject, of every kind."""
        return (
            len(self.subscribers) + len(self.formatted) + len(self.conflated)
            + len(self.waiting) + len(self.settling) + len(self.listeners)
        )

    @property
    def idle(self) -> bool:
        """No subscribers and nothing ever published: safe to forget."""
        return (
            self.seq == 0
            and not self.subscribers
            and not self.formatted
            and not self.conflated
            and not self.waiting
            and not self.settling
            and not self.listeners
        )

    @property
    def spent(self) -> bool:
        """Numbered, but nothing left to serve: no subscriber, no snapshot, nothing cached
        (a one-off subject whose messages expired)."""
        return (
            self.snapshot is None
            and not self.cache
            and not self.subscribers
            and not self.formatted
            and not self.conflated
            and not self.waiting
            and not self.settling
            and not self.listeners
        )
