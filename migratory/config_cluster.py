"""Config keys of the cluster: the member list (or its StatefulSet template), this
member's address, seeds, delivery mode, password (and the links' TLS, config_security),
Raft data and compaction, and the rules between them (docs/cluster.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from migratory.config_security import CLUSTER_TLS_SETTINGS
from migratory.config_values import (
    MAX_CLUSTER_MEMBERS,
    ORDINAL,
    ConfigError,
    Setting,
    _choice,
    _int,
    _member_template,
    _optional_address,
    _optional_addresses,
    _optional_count,
    _optional_ordinal,
    _seed_count,
    _text,
    parse_address,
)

if TYPE_CHECKING:
    from migratory.config_fields import ConfigFields

C = TypeVar("C", bound="ConfigFields")  # the Config, whose member list these rules complete

DEFAULT_ELECTION_TIMEOUT_MS = 150
"""``ClusterElectionTimeout``'s default: the timers seeds always had (cluster/raft_timings.py)."""
DEFAULT_SEED_LINK_WAIT = 35
"""``ClusterSeedLinkWait``'s default (cluster/seed_link_wait.py says why 35 s)."""

CLUSTER_SETTINGS: tuple[Setting, ...] = (
    Setting("ClusterMembers", "cluster_members", _optional_addresses, "",
            "Ordered, comma-separated host:port cluster addresses of all members (at most "
            f"{MAX_CLUSTER_MEMBERS:,}), identical on every member; empty: a single node. "
            "Seeds also use port + 1 for Raft. Members "
            "compare it when they link: only a list that extends another at its end (a "
            "scale-up rolling out) is accepted, any other difference is refused and the "
            "member the seeds refuse is not ready (docs/cluster.md, \"Members must agree\")."),
    Setting("ClusterMemberTemplate", "cluster_member_template", _member_template, "",
            "Instead of ClusterMembers: one host:port with `{ordinal}` in it, expanded for "
            "ordinals 0 .. ClusterMemberCount-1 (a StatefulSet: "
            "`migratory-{ordinal}.migratory-members:9800`)."),
    Setting("ClusterMemberCount", "cluster_member_count", _optional_count, "",
            "With ClusterMemberTemplate: how many members the list has (the largest size the "
            f"cluster may scale to, e.g. the HPA's maxReplicas; at most {MAX_CLUSTER_MEMBERS:,})."),
    Setting("ClusterMemberListen", "cluster_member_listen", _optional_address, "",
            "This member's cluster address; must be one of ClusterMembers. With "
            "ClusterMemberTemplate, set ClusterMemberOrdinal instead."),
    Setting("ClusterMemberOrdinal", "cluster_member_ordinal", _optional_ordinal, "",
            "With ClusterMemberTemplate: this member's ordinal (a StatefulSet pod's "
            "`apps.kubernetes.io/pod-index` label); its ClusterMemberListen is the template "
            "expanded for it, so the two cannot name different addresses. Set one of "
            "ClusterMemberOrdinal and ClusterMemberListen, not both."),
    Setting("ClusterMemberBind", "cluster_member_bind", _optional_address, "",
            "Where this member really listens for cluster links (Raft on port + 1) when peers "
            "reach it through another address (a proxy, NAT); empty: ClusterMemberListen."),
    Setting("ClusterSeedMemberCount", "cluster_seed_member_count", _seed_count, "",
            "3 or 5: the first members of ClusterMembers that run Raft; empty: 3 for clusters "
            "of 3-4 members, 5 for 5 or more."),
    Setting("ClusterDeliveryMode", "cluster_delivery_mode", _choice("Standard", "Guaranteed"),
            "Standard",
            "Standard: members forward publications, failover gives the snapshot. Guaranteed: "
            "seeds number messages through Raft, failover recovers every acknowledged message."),
    Setting("ClusterPassword", "cluster_password", _text, "",
            "Shared secret that members authenticate each other with (required for a cluster; "
            "also Raft's password)."),
    *CLUSTER_TLS_SETTINGS,
    Setting("ClusterDataDir", "cluster_data_dir", _text, "",
            "Directory where a seed keeps its Raft log and term (required for Guaranteed mode; "
            "one per member, kept across restarts: a seed that forgets its log may lose "
            "acknowledged messages). A seed does not start on damaged Raft files there: it "
            "names the file; move the directory aside to rejoin as a seed that lost its disk "
            "(docs/cluster.md, \"A damaged ClusterDataDir\"). Standard mode (optional): where a "
            "member records its lives, so that its next life after a SIGTERM's drain costs its "
            "peers' subscribers no DATA_RESYNC (docs/cluster.md, \"Standard mode\"); never "
            "shared by two members, never put back to an older copy."),
    Setting("ClusterMaxPendingPublishes", "cluster_max_pending_publishes",
            _int(1, unit=" of publishes"), "50000",
            "Guaranteed mode: publishes a member holds while they wait for their Raft commit; "
            "one more gets PUBLISH_FAILED (overloaded) at once instead of queueing."),
    Setting("ClusterRebalanceRate", "cluster_rebalance_rate", _int(0, 100, " of percent"), "0",
            "Rebalancing after scale-out: a member with more clients than the cluster's "
            "average moves up to this percentage of them per second (at least one) to other "
            "members, never below the average; each resumes there from its position. 0: off."),
    Setting("ClusterElectionTimeout", "cluster_election_timeout",
            _int(100, 5000, " of milliseconds"), str(DEFAULT_ELECTION_TIMEOUT_MS),
            "Guaranteed mode: a seed that hears no Raft leader for a random time between "
            "this many milliseconds and twice that stands for election; the leader's "
            "heartbeat comes every 4/15 of it (40 ms at 150) and a link silent for 20/3 of "
            "it (1 s) is dropped "
            "(cluster/raft_timings.py). Raise it when the round trip between seeds comes "
            "near it (seeds in different zones, a busy box): seeds then stand while the "
            "leader lives and depose it; or when the seeds' disks stall for seconds (a "
            "leader falls back after 8 times it without answers, and a vote waits for the "
            "voter's sync: docs/cluster.md, \"A slow disk\"). It costs failover time: a "
            "new leader no sooner "
            "than this after the old one died. Seeds may differ in it (not compared; "
            "docs/cluster.md, \"The election timeout\")."),
    Setting("ClusterSeedLinkWait", "cluster_seed_link_wait", _int(0, 600, " of seconds"),
            str(DEFAULT_SEED_LINK_WAIT),
            "Guaranteed mode: a seed that (re)started is not ready until every other seed "
            "whose name resolves has a Raft link with it, for at most this many seconds after its "
            "Raft node started (then it says in its log which seeds never linked). 35: the "
            "cluster DNS cache the Kubernetes manifests assume (30 s, minReadySeconds) and "
            "a dial made again; a PodDisruptionBudget counts a seed healthy once ready, so "
            "a drain could take a second seed while the third still dialled the first's old "
            "address (docs/cluster.md, \"Readiness\"). 0: no wait."),
    Setting("ClusterLogCompactionEntries", "cluster_log_compaction_entries",
            _int(100, unit=" of entries"), "20000",
            "A seed compacts its Raft log (writes a dump, drops the entries) once it holds "
            "more than this many entries, or ClusterLogCompactionTime after the last "
            "compaction. Each seed multiplies both by its own factor between 1 and 1.5 "
            "(drawn from its address), so no two seeds compact at the same moment."),
    Setting("ClusterLogCompactionTime", "cluster_log_compaction_time",
            _int(1, unit=" of seconds"), "120",
            "Seconds after which a seed compacts its Raft log even with fewer entries (see "
            "ClusterLogCompactionEntries)."),
    Setting("ClusterLogCompactionBytes", "cluster_log_compaction_bytes",
            _int(1 << 20, unit=" of bytes"), "67108864",
            "A seed also compacts its Raft log once the log's entries take more than this "
            "many bytes (times the seed's factor, see ClusterLogCompactionEntries). A seed "
            "holds its whole log in memory as well as on disk until it compacts it (~1.3 "
            "bytes of memory per byte of log; a 100-byte publish takes ~170 bytes of log), "
            "so this bounds that memory whatever the publish rate (at 10,000 publishes a "
            "second the log grew 1.6 MB a second: benchmarks/raft_log_memory.py). A "
            "leader sending a dump to a follower waits to compact up to 4 times this."),
)


def expand_member_template(config: C, key: Callable[[str], str]) -> C:
    """``ClusterMemberTemplate`` x ``ClusterMemberCount`` -> ``ClusterMembers``, and
    ``ClusterMemberOrdinal`` -> ``ClusterMemberListen`` (one source: the template)."""
    template, count = config.cluster_member_template, config.cluster_member_count
    ordinal = config.cluster_member_ordinal
    if not template:
        for name, unset in (("ClusterMemberCount", not count),
                            ("ClusterMemberOrdinal", ordinal is None)):
            if not unset:
                raise ConfigError(f"{key(name)} is set but ClusterMemberTemplate is empty")
        return config
    if config.cluster_members:
        raise ConfigError(
            f"set either {key('ClusterMembers')} or {key('ClusterMemberTemplate')}, not both"
        )
    if not count:
        raise ConfigError(f"{key('ClusterMemberTemplate')} is set: ClusterMemberCount is required")
    members = tuple(parse_address(template.replace(ORDINAL, str(n))) for n in range(count))
    if ordinal is None:
        return replace(config, cluster_members=members)
    if config.cluster_member_listen is not None:
        listen = config.cluster_member_listen
        raise ConfigError(
            f"{key('ClusterMemberListen')} = {listen[0]}:{listen[1]} and "
            f"{key('ClusterMemberOrdinal')} = {ordinal} are both set: set one (the ordinal "
            f"gives this member's address from {key('ClusterMemberTemplate')})"
        )
    if ordinal >= count:
        raise ConfigError(
            f"{key('ClusterMemberOrdinal')} = {ordinal} is past the member list: "
            f"{key('ClusterMemberCount')} = {count} lists ordinals 0 .. {count - 1} (on "
            "Kubernetes: a pod beyond the HPA's maxReplicas; raise maxReplicas instead)"
        )
    return replace(config, cluster_members=members, cluster_member_listen=members[ordinal])


def check_cluster(config: C, key: Callable[[str], str]) -> C:
    members = config.cluster_members
    if not members:
        for name, value in (
            ("ClusterMemberListen", config.cluster_member_listen),
            ("ClusterMemberBind", config.cluster_member_bind),
            ("ClusterSeedMemberCount", config.cluster_seed_member_count),
            ("ClusterDataDir", config.cluster_data_dir),
            ("ClusterRebalanceRate", config.cluster_rebalance_rate),
        ):
            if value:
                raise ConfigError(f"{key(name)} is set but ClusterMembers is empty")
        if config.cluster_delivery_mode == "Guaranteed":
            raise ConfigError(
                f"{key('ClusterDeliveryMode')} = Guaranteed needs ClusterMembers"
            )
        return config
    listed = key("ClusterMembers") if config.cluster_member_template == "" else (
        f"ClusterMembers ({key('ClusterMemberTemplate')})"
    )
    if len(members) > MAX_CLUSTER_MEMBERS:
        raise ConfigError(f"{listed} lists {len(members):,} members: at most "
                          f"{MAX_CLUSTER_MEMBERS:,}")
    duplicates = {f"{h}:{p}" for (h, p), n in Counter(members).items() if n > 1}
    if duplicates:
        raise ConfigError(f"{listed} lists {', '.join(sorted(duplicates))} more than once")
    listen = config.cluster_member_listen
    if listen is None:
        raise ConfigError(f"{listed} is set: ClusterMemberListen must name this member "
                          "(or, with a ClusterMemberTemplate, ClusterMemberOrdinal)")
    if listen not in members:
        raise ConfigError(
            f"{key('ClusterMemberListen')} {listen[0]}:{listen[1]} is not one of {listed}: "
            f"{', '.join(f'{h}:{p}' for h, p in members)}"
        )
    if not config.cluster_password:
        raise ConfigError(f"{listed} is set: ClusterPassword is required (members "
                          "authenticate each other and Raft must never run without a password)")
    seeds = config.cluster_seed_member_count or (3 if len(members) <= 4 else 5)
    if config.cluster_delivery_mode == "Guaranteed":
        mode = key("ClusterDeliveryMode")
        if len(members) < 3:
            raise ConfigError(
                f"{mode} = Guaranteed needs at least 3 members, {listed} has {len(members)}"
            )
        if not config.cluster_data_dir.strip():
            raise ConfigError(
                f"{mode} = Guaranteed needs ClusterDataDir (where seeds keep "
                "their Raft log across restarts)"
            )
        if seeds > len(members):
            raise ConfigError(
                f"{key('ClusterSeedMemberCount')} = {seeds} but {listed} has only {len(members)}"
            )
    return replace(config, cluster_seed_member_count=min(seeds, len(members)))
