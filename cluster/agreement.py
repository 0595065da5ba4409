"""Agreement: the settings two members must share, compared whenever a link is set up.

Pure: no sockets, no trio (``cluster/link_io.py`` exchanges the settings, right after
authentication; ``cluster/agreement_probe.py`` asks the seeds). Members that do not
agree refuse the link, and each says why, naming the key and both values.

What must be equal on both sides of a link (:func:`disagreement`):

- ``ClusterDeliveryMode``: a Standard member forwards publications that a Guaranteed
  member would never number, and the other way round;
- ``ClusterSeedMemberCount`` (as applied: empty means 3 for 3-4 members, 5 for more)
  and the seeds themselves, in order: they are the Raft members, and a member that
  counts another seed dials a member that cannot number its publishes (Guaranteed
  mode only: Standard members have no seeds but to ask about their settings);
- ``ClusterMembers``, except that one list may extend the other at its end: raising
  ``ClusterMemberCount`` (``maxReplicas`` on Kubernetes) rolls the longer list out one
  pod at a time, and the pods already rolled must keep linking with those not yet
  rolled (deploy/k8s/README.md, Scaling). Any other difference -- a member missing in
  the middle, another order -- is refused;
- the subject group count (a code constant: only members of migratory versions that
  hash subjects differently disagree on it);
- ``MaxMessageSize`` and ``MaxFrameSize`` (:func:`size_disagreement`): a message one
  member takes from its clients reaches every member (the committed stream, a Standard
  publish, a cache sync), whose link takes frames up to a limit derived from its own
  ``MaxFrameSize`` (``cluster/link_limits.py``), and a member's ``/$mqtt-session/``
  records are bounded by ``MaxFrameSize`` alone. A seed with the larger sizes had a
  message acknowledged that a non-seed's link then refused on every batch, for as long
  as it was committed or cached: the non-seed replicated nothing more (not ready, its
  clients' resumes stalled); a non-seed with the larger sizes had its forward end the
  seed's link again and again. Within one member ``MaxFrameSize > MaxMessageSize`` and
  ``ClientMaxPendingBytes >= 2 x MaxMessageSize`` (migratory/config_sizes.py), so with
  the two equal everywhere every member takes every message: ``ClientMaxPendingBytes``
  may differ. A peer too old to send them is not compared;
- who a member is: a link from a process that claims this member's own
  ``ClusterMemberListen`` is refused (two members configured with one address).

What may differ, and is only logged (:func:`soft_differences`): the extension of
``ClusterMembers`` above, ``MaxCachedMessagesPerSubject`` and ``MqttSessionExpiry`` (a
change of each rolls out pod by pod; until it has, a client resuming on the member with
the smaller cache may get ``DATA_RESYNC`` where it would have got ``DATA_SYNC``, and
the shortest expiry discards a persistent MQTT session whose client is away: every
member sweeps the sessions it holds, ``migratory/server/mqtt_expiry.py``). Two members with one
``ServerName`` get a warning (:func:`name_clash`): nothing routes by it; so do two of
another ``Entitlement`` (:func:`entitlement_difference`): a change of it rolls out pod by
pod, but one member's file left at ``None`` lets anyone publish into the cluster
through it (a forwarded publish is not checked again by the seed). Two of one
``Entitlement`` whose keys differ -- a token key, issuer or audience, a plugin, its
options or code, ``MonitorToken``, compared as keyed digests (``agreement_keys.py``) --
get a warning naming the keys (:func:`entitlement_key_difference`): a key rotation rolls
out pod by pod, so refusing would stall it at the first pod, but until it has a client's
rights depend on the member it lands on.

:class:`SeedAgreement` turns what a member learnt from the seeds into its readiness: a
member that a majority of the seeds disagree with (or that found another process at
its own address) is not ready, so a rolling change that breaks the rule stalls at the
first pod instead of serving clients from a member that routes differently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from cluster.agreement_keys import entitlement_keys
from cluster.coordination import GROUP_COUNT

if TYPE_CHECKING:
    from migratory.config import Config

SHOWN_MEMBERS = 12
"""Members of a list written out in a log line; more are counted."""


def _name(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


@dataclass(frozen=True, slots=True)
class MemberLimits:
    """The settings a member added to its :class:`MemberSettings` later (``"mm"``,
    ``"mf"``, ``"e"``, ``"sx"`` of the link's ``Settings``: all, or none)."""

    max_message_size: int
    max_frame_size: int
    entitlement: str
    mqtt_session_expiry: int


@dataclass(frozen=True, slots=True)
class MemberSettings:
    """What one member tells the other at link set-up."""

    member: str
    """Its ClusterMemberListen, host:port."""
    members: tuple[str, ...]
    seed_count: int
    delivery_mode: str
    max_cached: int
    incarnation: str
    """Random per process: tells two processes with one member name apart (a Standard
    member's also names its clean predecessor: :mod:`cluster.standard_lives`)."""
    group_count: int = GROUP_COUNT
    server_name: str = ""
    """Its ServerName (logs, audit, the clients' ``connected``): only compared to warn."""
    limits: MemberLimits | None = None
    """Its MaxMessageSize, MaxFrameSize, Entitlement and MqttSessionExpiry (None: a
    member that predates them, which does not send them)."""
    entitlement_keys: tuple[tuple[str, str], ...] | None = None
    """Each key that decides a client's rights under its Entitlement, with a keyed digest
    of its value (``cluster/agreement_keys.py``; None: a member that predates them)."""

    @property
    def seeds(self) -> tuple[str, ...]:
        return self.members[: self.seed_count]

    @classmethod
    def from_config(cls, config: Config, incarnation: str) -> MemberSettings:
        assert config.cluster_member_listen is not None
        return cls(
            member=_name(config.cluster_member_listen),
            members=tuple(_name(a) for a in config.cluster_members),
            seed_count=config.cluster_seed_member_count,
            delivery_mode=config.cluster_delivery_mode,
            max_cached=config.max_cached_messages_per_subject,
            incarnation=incarnation,
            server_name=config.server_name,
            limits=MemberLimits(config.max_message_size, config.max_frame_size,
                                config.entitlement, config.mqtt_session_expiry),
            entitlement_keys=entitlement_keys(config),
        )

    def without_limits(self) -> MemberSettings:
        """These settings as a member that predates :attr:`limits` sends them."""
        return replace(self, limits=None, entitlement_keys=None)

    def without_entitlement_keys(self) -> MemberSettings:
        """These settings as a member that predates :attr:`entitlement_keys` sends them."""
        return replace(self, entitlement_keys=None)


def _listed(members: Sequence[str]) -> str:
    shown = ", ".join(members[:SHOWN_MEMBERS])
    more = len(members) - SHOWN_MEMBERS
    return f"[{shown}{f', ... {more} more' if more > 0 else ''}]"


def _extends(longer: Sequence[str], shorter: Sequence[str]) -> bool:
    return len(longer) >= len(shorter) and tuple(longer[: len(shorter)]) == tuple(shorter)


def disagreement(mine: MemberSettings, theirs: MemberSettings) -> str | None:
    """Why this member (``mine``) must refuse a link with ``theirs``, or None.

    Symmetric in what it refuses; the text names the key, this member's value
    ("here") and the peer's ("there")."""
    peer = theirs.member
    if theirs.member == mine.member and theirs.incarnation != mine.incarnation:
        return (
            f"another process (incarnation {theirs.incarnation}) claims {peer}, this "
            f"member's ClusterMemberListen (this one is {mine.incarnation}): two members "
            "configured with the same address"
        )
    if mine.member not in theirs.members:
        return (
            f"this member ({mine.member}) is not one of {peer}'s ClusterMembers: "
            f"there {_listed(theirs.members)}"
        )
    if peer not in mine.members:
        return f"{peer} is not one of ClusterMembers here: {_listed(mine.members)}"
    if theirs.delivery_mode != mine.delivery_mode:
        return (
            f"ClusterDeliveryMode differs from {peer}'s: {mine.delivery_mode} here, "
            f"{theirs.delivery_mode} there"
        )
    guaranteed = mine.delivery_mode == "Guaranteed"  # Standard members have no Raft
    if guaranteed and theirs.seed_count != mine.seed_count:
        return (
            f"ClusterSeedMemberCount differs from {peer}'s: {mine.seed_count} here, "
            f"{theirs.seed_count} there (as applied: empty is 3 for 3-4 members, 5 for more)"
        )
    if theirs.group_count != mine.group_count:
        return (
            f"the subject group count differs from {peer}'s: {mine.group_count} here, "
            f"{theirs.group_count} there (another migratory version)"
        )
    sizes = size_disagreement(mine, theirs)
    if sizes is not None:
        return sizes
    if theirs.members == mine.members:
        return None
    seeds_differ = guaranteed and theirs.seeds != mine.seeds
    what = "the seeds differ" if seeds_differ else (
        "only members added or removed at the end may differ while a change rolls out"
    )
    if seeds_differ or not (
        _extends(mine.members, theirs.members) or _extends(theirs.members, mine.members)
    ):
        return (
            f"ClusterMembers differ from {peer}'s ({what}): here {_listed(mine.members)}, "
            f"there {_listed(theirs.members)}"
        )
    return None


def size_disagreement(mine: MemberSettings, theirs: MemberSettings) -> str | None:
    """Why members of another ``MaxMessageSize`` or ``MaxFrameSize`` refuse to link
    (both modes), or None (equal, or a side too old to say)."""
    if mine.limits is None or theirs.limits is None:
        return None
    for key, here, there in (
        ("MaxMessageSize", mine.limits.max_message_size, theirs.limits.max_message_size),
        ("MaxFrameSize", mine.limits.max_frame_size, theirs.limits.max_frame_size),
    ):
        if here != there:
            return (
                f"{key} differs from {theirs.member}'s: {here} here, {there} there (every "
                "member must take every other's largest message; docs/cluster.md, "
                "\"Changing MaxMessageSize or MaxFrameSize\")"
            )
    return None


def entitlement_difference(mine: MemberSettings, theirs: MemberSettings) -> str | None:
    """Two members of another ``Entitlement``: allowed (a change of it rolls out pod by
    pod), but warned: the member with the weaker one lets its clients publish what the
    other would deny, and its forwards are numbered without another check."""
    if mine.limits is None or theirs.limits is None:
        return None
    if mine.limits.entitlement == theirs.limits.entitlement:
        return None
    return (
        f"Entitlement differs from {theirs.member}'s: {mine.limits.entitlement} here, "
        f"{theirs.limits.entitlement} there (allowed while a change rolls out; until it has, "
        "a client is allowed on one member what another denies it, and a publish "
        "forwarded by a member is numbered without another entitlement check)"
    )


def entitlement_key_difference(mine: MemberSettings, theirs: MemberSettings) -> str | None:
    """Two members of one ``Entitlement`` whose keys differ (a token key, issuer,
    audience, plugin, its options or code, ``MonitorToken``): allowed -- a key rotation
    rolls out pod by pod, and a refused link would stall it at the first pod --, but
    warned, naming the keys (never a value: only digests are compared)."""
    if mine.entitlement_keys is None or theirs.entitlement_keys is None:
        return None
    if mine.limits is None or theirs.limits is None or (
            mine.limits.entitlement != theirs.limits.entitlement):
        return None  # (another Entitlement: entitlement_difference says so)
    here, there = dict(mine.entitlement_keys), dict(theirs.entitlement_keys)
    differ = sorted(k for k in here.keys() | there.keys() if here.get(k) != there.get(k))
    if not differ:
        return None
    return (
        f"the entitlement's keys differ from {theirs.member}'s: {', '.join(differ)} "
        f"(Entitlement {mine.limits.entitlement} on both; compared by a keyed digest; allowed "
        "while a change rolls out; until it has, a client's token or rights are accepted on "
        "one member and denied on another)"
    )


def soft_differences(mine: MemberSettings, theirs: MemberSettings) -> tuple[str, ...]:
    """What differs between two members that agree, and is allowed (to be logged)."""
    peer = theirs.member
    found = []
    if theirs.members != mine.members:
        found.append(
            f"ClusterMembers of {peer} has {len(theirs.members)} members, "
            f"{len(mine.members)} here (one extends the other: a change of "
            "ClusterMemberCount rolling out)"
        )
    if theirs.max_cached != mine.max_cached:
        found.append(
            f"MaxCachedMessagesPerSubject differs from {peer}'s: {mine.max_cached} here, "
            f"{theirs.max_cached} there (allowed while a change rolls out: a client that "
            "resumes on the member with the smaller cache may get DATA_RESYNC)"
        )
    if mine.limits is not None and theirs.limits is not None and (
        (here := mine.limits.mqtt_session_expiry) != (there := theirs.limits.mqtt_session_expiry)
    ):
        found.append(
            f"MqttSessionExpiry differs from {peer}'s: {here} here, {there} there (allowed "
            "while a change rolls out: every member discards the persistent MQTT sessions "
            "it finds stale, so the shortest applies to a session whose client is away)"
        )
    return tuple(found)


def name_clash(mine: MemberSettings, theirs: MemberSettings) -> str | None:
    """Two members with one ServerName: allowed (nothing routes by it), but their
    logs, audit lines and the clients' ``connected`` cannot be told apart."""
    if theirs.member == mine.member or not mine.server_name:
        return None
    if theirs.server_name != mine.server_name:
        return None
    return (
        f"ServerName {mine.server_name!r} is also {theirs.member}'s: two members with one "
        "name in logs, audit and the clients' connected (set ServerName per member)"
    )


@dataclass(slots=True)
class SeedAgreement:
    """What this member learnt from the seeds and from its own address; its readiness.

    Each seed's latest verdict: None (agrees), a reason (disagrees); a seed that could
    not be asked counts for nothing. Not ready: until the first round of questions has
    been answered (or, before, a majority agreed: :meth:`compared`), when another
    process answers at this member's own address, or when a majority of the seeds
    disagree with it (this member agreeing with itself, if it is a seed). A minority
    that disagrees is the odd one out: this member stays ready. A Guaranteed member
    starts its role only once :meth:`settled`.
    """

    me: str
    seeds: tuple[str, ...]
    verdicts: dict[str, str | None] = field(default_factory=dict)
    own_address: str | None = None
    """Why the process answering at this member's own address is not this one."""
    own_checked: bool = False
    """Whether the process at this member's own address has answered (this one, or
    another: :attr:`own_address`)."""
    rounds: int = 0

    def record(self, seed: str, verdict: str | None) -> None:
        """``seed`` linked (None: agrees, or is too old to compare) or refused (why)."""
        self.verdicts[seed] = verdict

    def forget(self, seed: str) -> None:
        """``seed`` could not be asked (down, unreachable, an older version)."""
        self.verdicts.pop(seed, None)

    def agreed(self) -> set[str]:
        """The seeds (other than this member) that agreed when last asked."""
        return {s for s in self.seeds if s != self.me and s in self.verdicts
                and self.verdicts[s] is None}

    def against(self) -> dict[str, str]:
        """The seeds that disagree with this member, and why."""
        return {s: r for s in self.seeds if s != self.me and (r := self.verdicts.get(s))}

    def compared(self) -> bool:
        """Whether this member knows enough to be judged: a round of questions ended, or,
        before, its own address answered and a majority of the seeds (itself included, if
        it is a seed) agreed -- no answer still to come can then make a majority disagree.
        A seed of a whole cluster restarted at once so starts Raft once it and one other
        seed are up, not once the slowest seed's question has timed out (up to
        ``ASK_TIMEOUT``, 12 s: a seed still starting, or starved, took the TCP dial and
        did not answer in time)."""
        if self.rounds:
            return True
        if not self.own_checked:
            return False
        agreed = sum(1 for s in self.seeds if s == self.me or (
            s in self.verdicts and self.verdicts[s] is None))
        return agreed >= len(self.seeds) // 2 + 1

    def settled(self, *, majority: bool) -> bool:
        """Whether this member may start its role: nothing against it and, with
        ``majority`` (a seed, before it runs Raft), a majority of the seeds (itself
        included) linked with it -- agreeing, or too old to compare. A non-seed needs no
        majority: each of its links compares settings anyway, and one seed it can reach
        is enough to serve from (a partial partition)."""
        if self.reason() is not None:
            return False
        if not majority:
            return True
        linked = sum(1 for s in self.seeds if s == self.me or (
            s in self.verdicts and self.verdicts[s] is None))
        return linked >= len(self.seeds) // 2 + 1

    def waiting(self) -> str:
        """Why a member not yet :meth:`settled` waits, with what it has learnt so far: a
        seed whose seeds do not all exist (``ClusterSeedMemberCount`` raised on it alone)
        never hears a majority, and must still say which setting the others refuse."""
        text = "member is comparing cluster settings with the seeds"
        against = self.against()
        unreached = sum(1 for s in self.seeds if s != self.me and s not in self.verdicts)
        found = []
        if against:
            found.append(f"{len(against)} of the {len(self.seeds)} seeds disagree so far: "
                         f"{next(iter(against.values()))}")
        if self.rounds and unreached:
            found.append(f"{unreached} of the {len(self.seeds)} seeds not reached")
        return "; ".join([text, *found])

    def reason(self) -> str | None:
        """Why this member must not take clients (or run its role), or None."""
        if self.own_address is not None:
            return self.own_address
        against = self.against()
        if len(against) >= len(self.seeds) // 2 + 1:
            first = next(iter(against.values()))
            return f"{len(against)} of the {len(self.seeds)} seeds disagree: {first}"
        if not self.compared():
            return "member is comparing its cluster settings with the seeds'"
        return None


@dataclass(slots=True)
class Repeats:
    """Which refusals to log at warning: each (peer, reason) once every ``every`` seconds
    (a refused member redials every 0.3 s; its log must stay readable)."""

    every: float = 60.0
    last: dict[tuple[str, str], float] = field(default_factory=dict)

    def first(self, peer: str, reason: str, now: float) -> bool:
        """Whether this refusal is worth a warning now."""
        key = (peer, reason)
        then = self.last.get(key)
        if then is not None and now - then < self.every:
            return False
        if len(self.last) >= 1024:
            self.last.clear()
        self.last[key] = now
        return True
