"""Which forwarded publications a Standard member may have missed.

A Standard member forwards each publication its clients make to its peers, best effort:
its queue towards a peer drops when full, a link that breaks loses what was in flight, a
member that restarts starts new lineages. It numbers its forwards of each subject
(:class:`ForwardNumbering`: an epoch per subject, seq + 1 per forward, dropped ones too):
not with its hub's positions, which count the subject's publications from every member
(two publishers on two members made every forward look like a gap). The receiving member renumbers
each forward in its own epoch, so its subscribers cannot see such a loss in their
positions: it must tell them. :class:`ForwardLineage` remembers, per peer and subject,
the sender's position of the last forward taken, and says whether the next one follows
it (same epoch, seq + 1; or seq 1 of a subject never heard of from that peer, when
nothing can be missing before it: below). Anything else may have skipped a message: the
member starts a new lineage of the subject (its subscribers get the snapshot and
``DATA_RESYNC``, a resume from before it too). A forward at or before the last one (the
sender's repair of a subject whose later forwards did arrive) is dropped: no duplicate.

Seq 1 says only that nothing came before it *in that process's life*: a peer that
restarts numbers every subject from seq 1 again, in new epochs, and what its earlier life
acknowledged and never forwarded (its link down, its queue lost when it died) is gone
without a trace. So a first forward follows on only when the receiver knows no earlier
life of the peer can have left it out: it holds no subscriber of the subject (no one to
miss it: no subject state, no wildcard filter matching it), or it came to hold the
subject after it met the peer's current process (the
``incarnation`` of its link settings, :meth:`ForwardLineage.met`, on a link either way):
every earlier life of the peer had ended by then, before anyone here held the subject.
A subject held here before that meeting, a forward on a link of an older process or of
one whose incarnation is not known (a member that predates link settings), is a gap at
its first forward: one resync per subject a restarted peer publishes that was held here
before, a needless one when nothing was lost -- never a silent one. A goodbye alone from
a cleanly drained peer cannot lift that: a life between it and the next one, which never
reached this member, leaves nothing here to tell it by. With a data directory it can
(:mod:`cluster.standard_lives`): the peer's new life names the life just before it, when
that one ended cleanly; when that is the life that said goodbye here, the new life is
*chained* to it: every forward of the old life came (or was told as a gap), so the new
life's seq 1 of a subject the old one forwarded follows on, and the meeting's moment
stays that of the first life of the chain.

The sender cannot leave a loss at the end unseen either: :class:`UnsentSubjects` are
the subjects a peer may lack the newest message of (a forward dropped, or sent on a link
that broke); once its queue is empty the sender forwards each one's newest message
again (the repair: its last forward of the subject, at its forward position) -- after a
gap, or seen and dropped.

Bounded: at most ``max_subjects`` subjects per peer are remembered, the least recently
forwarded forgotten first; a forgotten subject's next forward counts as a possible gap
(a needless resync, never a silent one). Sans-I/O: no trio, no sockets.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from cluster.standard_lives import clean_predecessor, life_id
from migratory.model.message import Message, MessageType
from migratory.model.position import Position, new_epoch

__all__ = ["MAX_SUBJECTS", "Forward", "ForwardLineage", "ForwardNumbering", "UnsentSubjects"]

MAX_SUBJECTS = 100_000
"""Subjects remembered per peer."""


class Forward(enum.Enum):
    NEXT = "next"
    """The next one of its subject from that peer: publish it."""
    GAP = "gap"
    """Something may be missing before it: resync the subject, then publish it."""
    SEEN = "seen"
    """At or before the last one taken (a repair of what came after all): drop it."""


@dataclass(slots=True)
class ForwardLineage:
    max_subjects: int = MAX_SUBJECTS
    gaps: int = 0
    """Forwards that did not follow the previous one of their subject and peer."""
    _last: dict[str, dict[str, Position]] = field(default_factory=dict)
    _forgetting: set[str] = field(default_factory=set)
    """Peers some subject of which was forgotten: a subject not remembered may be one."""
    _met: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Per peer, the process (incarnation) last met and the hub's moment
    (``Hub.holdings_made``) then -- or, chained, when the first life of the chain was
    met (one entry per ClusterMembers peer)."""
    _ended: dict[str, str] = field(default_factory=dict)
    """Per peer, the id of the life last met when it said goodbye here."""
    _refused: dict[str, str] = field(default_factory=dict)
    """Per peer, the incarnation a forward of which was refused here (not taken)."""
    _clean: dict[str, dict[str, None]] = field(default_factory=dict)
    """Per peer, the subjects whose last forward came from a life that said goodbye, the
    current one chained to it: its seq 1 follows on."""

    def met(self, peer: str, incarnation: str | None, made: int) -> bool:
        """A link with ``peer`` is set up (either way), its settings naming its process,
        ``incarnation`` (None: a member that predates link settings, nothing learnt);
        ``made``: the hub's moment now (``Hub.holdings_made``: it grows with each subject
        made and each wildcard filter first held). Chained (True) when ``incarnation``
        names as its clean predecessor the life met last, which said goodbye here."""
        current = self._met.get(peer)
        if incarnation is None or (current is not None and current[0] == incarnation):
            return False
        ended = self._ended.pop(peer, None)
        if (current is not None and ended is not None and ended == life_id(current[0])
                and clean_predecessor(incarnation) == ended):
            self._met[peer] = (incarnation, current[1])
            clean = self._clean.setdefault(peer, {})
            for subject in self._last.pop(peer, {}):
                clean.pop(subject, None)
                clean[subject] = None
                if len(clean) > self.max_subjects:
                    del clean[next(iter(clean))]  # (its next seq 1: the rule of a first)
            return True
        self._met[peer] = (incarnation, made)
        self._clean.pop(peer, None)  # a life between may have published them: gaps
        return False

    def ended(self, peer: str, incarnation: str | None) -> None:
        """``peer``'s process ``incarnation`` said goodbye (StandardGoodbye) on its link:
        every forward it numbered came before, or was told as a gap. Kept while it is the
        life met last and none of its forwards was refused here."""
        current = self._met.get(peer)
        if (incarnation is not None and current is not None and current[0] == incarnation
                and self._refused.get(peer) != incarnation):
            self._ended[peer] = life_id(incarnation)

    def refused(self, peer: str, incarnation: str | None) -> None:
        """A forward of ``peer``'s process ``incarnation`` was refused here: not taken, so
        its goodbye cannot say that every forward came."""
        if incarnation is not None:
            self._refused[peer] = incarnation
            if self._ended.get(peer) == life_id(incarnation):
                del self._ended[peer]

    def take(self, peer: str, message: Message, *, incarnation: str | None = None,
             made: int | None = None) -> Forward:
        """Take ``message``, forwarded by ``peer`` with its position there, on a link of
        its process ``incarnation``; ``made``: since when this member holds the subject
        (``Hub.made``: its state or a wildcard filter matching it; None: it holds none).
        Whether it follows the last one taken of its subject from ``peer`` with nothing
        between."""
        last = self._last.setdefault(peer, {})
        if incarnation is not None and self._ended.get(peer) == life_id(incarnation):
            del self._ended[peer]  # a forward after its goodbye: the goodbye said too much
        if message.seq == 0:  # not numbered by the peer (no member sends that): as it comes
            last.pop(message.subject, None)
            self._forgetting.add(peer)  # (its next one is checked as a first one)
            return Forward.NEXT
        previous = last.get(message.subject)
        if previous is None and self._after_a_clean_life(peer, message.subject, incarnation):
            follows = message.seq == 1
        elif previous is None:
            follows = (message.seq == 1 and peer not in self._forgetting
                       and self._after_any_earlier_life(peer, incarnation, made))
        elif message.epoch == previous.epoch and message.seq <= previous.seq:
            return Forward.SEEN
        else:
            follows = message.epoch == previous.epoch and message.seq == previous.seq + 1
            del last[message.subject]  # (re-inserted last: the most recently forwarded)
        last[message.subject] = Position(message.epoch, message.seq)
        if len(last) > self.max_subjects:
            del last[next(iter(last))]
            self._forgetting.add(peer)
        if follows:
            return Forward.NEXT
        self.gaps += 1
        return Forward.GAP

    def _after_a_clean_life(self, peer: str, subject: str, incarnation: str | None) -> bool:
        """Whether the last forward of ``subject`` came from a life that said goodbye,
        the current one (``incarnation``) chained to it; forgotten here."""
        clean = self._clean.get(peer)
        if not clean or subject not in clean:
            return False
        del clean[subject]
        current = self._met.get(peer)
        return incarnation is not None and current is not None and current[0] == incarnation

    def _after_any_earlier_life(self, peer: str, incarnation: str | None,
                                made: int | None) -> bool:
        """Whether nobody here can have missed a forward of an earlier life of
        ``peer``'s process ``incarnation``: the subject is not held here, or was made
        after this member met that process (when every earlier life had ended)."""
        if made is None:
            return True
        met = self._met.get(peer)
        return met is not None and met[0] == incarnation and made > met[1]


@dataclass(slots=True)
class UnsentSubjects:
    """Per peer, the subjects whose newest message the peer may not have. Each set holds
    at most ``max_subjects``, the least recent forgotten first (as
    :class:`ForwardNumbering` forgets their last forward, which a repair would send):
    the kernel's buffers of a link hold far fewer messages than that."""

    max_subjects: int = MAX_SUBJECTS
    unsent: dict[str, None] = field(default_factory=dict)
    """A forward dropped (queue full) or lost with a link, nothing of the subject since."""
    on_link: dict[str, None] = field(default_factory=dict)
    """Forwarded on the current link: unsent if it breaks (in flight or in its buffers)."""

    def queued(self, subject: str) -> None:
        self.unsent.pop(subject, None)  # its next forward shows the gap, if any

    def dropped(self, subject: str) -> None:
        self._note(self.unsent, subject)

    def sent(self, subject: str) -> None:
        self._note(self.on_link, subject)

    def _note(self, subjects: dict[str, None], subject: str) -> None:
        subjects.pop(subject, None)
        subjects[subject] = None
        if len(subjects) > self.max_subjects:
            del subjects[next(iter(subjects))]

    def link_lost(self) -> None:
        for subject in self.on_link:
            self._note(self.unsent, subject)
        self.on_link = {}

    def repairs(self) -> list[str]:
        """The subjects to forward again, now; forgotten here."""
        subjects, self.unsent = sorted(self.unsent), {}
        return subjects


MAX_KEPT_BYTES = 64 * 1024 * 1024
"""Bytes (``Message.size()``) of the last forwards a sender keeps for repairs."""


FORGOTTEN_MARKS = 1 << 20
"""Bits that mark, by the subject's hash, the subjects a sender's numbering forgot
(128 KiB, made at the first one)."""


@dataclass(slots=True)
class ForwardNumbering:
    """A sender's numbering of its forwards: per subject, a random epoch and seq + 1 per
    forward. At most ``max_subjects`` subjects, the least recently forwarded forgotten
    first: a forgotten subject's next forward starts a new epoch (a resync there, never
    a position given twice) at seq 2, not 1: seq 1 tells a peer that this life forwarded
    nothing of the subject before, and a peer that got nothing of the old epoch (dropped,
    its repair forgotten with it) would take it as the first (a silent gap). A subject
    whose mark another forgotten one set starts at 2 too (a needless resync). The last
    forward of each is kept for a repair, within ``max_bytes`` (the least recent dropped
    first: a repair of it is not possible, its peer sees the loss with the subject's next
    forward)."""

    max_subjects: int = MAX_SUBJECTS
    max_bytes: int = MAX_KEPT_BYTES
    kept_bytes: int = 0
    _last: dict[str, Position] = field(default_factory=dict)
    _kept: dict[str, Message] = field(default_factory=dict)
    _forgotten: bytearray | None = None

    def number(self, message: Message) -> Message:
        """``message`` at its subject's next forward position."""
        subject = message.subject
        previous = self._last.pop(subject, None)
        if previous is None:
            epoch, seq = new_epoch(), 2 if self._may_have_forgotten(subject) else 1
        else:
            epoch, seq = previous.epoch, previous.seq + 1
        numbered = replace(message, epoch=epoch, seq=seq, type=MessageType.UPDATE,
                           closure=None)
        self._last[subject] = Position(epoch, seq)
        if len(self._last) > self.max_subjects:
            oldest = next(iter(self._last))
            del self._last[oldest]
            self._drop_kept(oldest)
            self._mark_forgotten(oldest)
        self._drop_kept(subject)
        self._kept[subject] = numbered
        self.kept_bytes += numbered.size()
        while self.kept_bytes > self.max_bytes and self._kept:
            self._drop_kept(next(iter(self._kept)))
        return numbered

    def _mark_forgotten(self, subject: str) -> None:
        if self._forgotten is None:
            self._forgotten = bytearray(FORGOTTEN_MARKS // 8)
        bit = hash(subject) & (FORGOTTEN_MARKS - 1)
        self._forgotten[bit >> 3] |= 1 << (bit & 7)

    def _may_have_forgotten(self, subject: str) -> bool:
        if self._forgotten is None:
            return False
        bit = hash(subject) & (FORGOTTEN_MARKS - 1)
        return bool(self._forgotten[bit >> 3] & 1 << (bit & 7))

    def _drop_kept(self, subject: str) -> None:
        kept = self._kept.pop(subject, None)
        if kept is not None:
            self.kept_bytes -= kept.size()

    def last(self, subject: str) -> Message | None:
        """The last forward of ``subject``, at its position (None: forgotten, or not
        kept within ``max_bytes``)."""
        return self._kept.get(subject)
