"""cluster/agreement.py: which differences between two members' settings refuse a link."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cluster.agreement import (
    MemberLimits,
    MemberSettings,
    Repeats,
    SeedAgreement,
    disagreement,
    entitlement_difference,
    name_clash,
    soft_differences,
)
from migratory.config import Config

S0, S1, S2, N3, N4, N5 = (f"10.0.0.{i}:9800" for i in range(6))
MEMBERS = (S0, S1, S2, N3, N4)


def settings(member: str = S0, **changes: object) -> MemberSettings:
    base = MemberSettings(
        member=member, members=MEMBERS, seed_count=3, delivery_mode="Guaranteed",
        max_cached=1000, incarnation=f"i-{member}",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


# (what the peer N3 has, a part of the refusal or None when allowed)
CASES = [
    pytest.param({}, None, id="identical"),
    pytest.param({"members": (*MEMBERS, N5)}, None, id="one more at the end (scale-up)"),
    pytest.param({"members": (S0, S1, S2, N3)}, None, id="one fewer at the end"),
    pytest.param({"members": (S0, S1, S2, N5, N3, N4)},
                 "ClusterMembers differ from 10.0.0.3:9800's (only members added or removed at "
                 "the end may differ while a change rolls out): here [10.0.0.0:9800, "
                 "10.0.0.1:9800, 10.0.0.2:9800, 10.0.0.3:9800, 10.0.0.4:9800], there "
                 "[10.0.0.0:9800, 10.0.0.1:9800, 10.0.0.2:9800, 10.0.0.5:9800, 10.0.0.3:9800, "
                 "10.0.0.4:9800]", id="one more in the middle"),
    pytest.param({"members": (S0, S1, S2, N3, N5)}, "only members added or removed at the end",
                 id="another last member"),
    pytest.param({"members": (S0, S1, S2, N4, N3)}, "only members added or removed at the end",
                 id="non-seeds in another order"),
    pytest.param({"members": (S0, S2, S1, N3, N4)}, "ClusterMembers differ from 10.0.0.3:9800's "
                 "(the seeds differ)", id="seeds in another order"),
    pytest.param({"members": (S0, S1, N3, S2, N4)}, "(the seeds differ)",
                 id="a non-seed moved among the seeds"),
    pytest.param({"seed_count": 5}, "ClusterSeedMemberCount differs from 10.0.0.3:9800's: 3 "
                 "here, 5 there", id="seed count"),
    pytest.param({"delivery_mode": "Standard"}, "ClusterDeliveryMode differs from "
                 "10.0.0.3:9800's: Guaranteed here, Standard there", id="delivery mode"),
    pytest.param({"group_count": 128}, "the subject group count differs from 10.0.0.3:9800's: "
                 "64 here, 128 there", id="subject groups"),
    pytest.param({"max_cached": 10}, None, id="MaxCachedMessagesPerSubject (allowed)"),
]


@pytest.mark.parametrize(("theirs", "refusal"), CASES)
def test_the_rule_table(theirs: dict[str, object], refusal: str | None) -> None:
    mine, peer = settings(S0), settings(N3, **theirs)
    found = disagreement(mine, peer)
    if refusal is None:
        assert found is None
    else:
        assert found is not None and refusal in found
    # both sides refuse, or neither (each says why with its own values first)
    assert (disagreement(peer, mine) is None) == (found is None)


LIMITS = MemberLimits(max_message_size=131072, max_frame_size=1048576, entitlement="Token",
                      mqtt_session_expiry=604800)


@pytest.mark.parametrize("mode", ["Guaranteed", "Standard"])
@pytest.mark.parametrize(("theirs", "refusal"), [
    pytest.param(LIMITS, None, id="equal"),
    pytest.param(replace(LIMITS, max_message_size=6_000_000, max_frame_size=8_388_608),
                 "MaxMessageSize differs from 10.0.0.3:9800's: 131072 here, 6000000 there",
                 id="MaxMessageSize (and MaxFrameSize)"),
    pytest.param(replace(LIMITS, max_frame_size=1048577), "MaxFrameSize differs from "
                 "10.0.0.3:9800's: 1048576 here, 1048577 there", id="MaxFrameSize"),
    pytest.param(replace(LIMITS, entitlement="None"), None, id="Entitlement (allowed)"),
    pytest.param(None, None, id="a peer too old to send them"),
])
def test_message_sizes_must_be_equal_in_both_modes(
    mode: str, theirs: MemberLimits | None, refusal: str | None
) -> None:
    """Before: not compared. A seed with the larger sizes had a message acknowledged that
    a non-seed's link refused on every batch from then on (it replicated nothing more);
    a Standard member's publish would end its peer's link the same way."""
    mine = settings(S0, delivery_mode=mode, limits=LIMITS)
    peer = settings(N3, delivery_mode=mode, limits=theirs)
    found = disagreement(mine, peer)
    if refusal is None:
        assert found is None
    else:
        assert found is not None and found.startswith(refusal), found
        assert "docs/cluster.md" in found
    assert (disagreement(peer, mine) is None) == (found is None)
    assert disagreement(mine.without_limits(), peer) is None  # too old to compare


def test_another_entitlement_links_with_a_warning_naming_both() -> None:
    mine = settings(S0, limits=LIMITS)
    assert entitlement_difference(mine, settings(N3, limits=LIMITS)) is None
    assert entitlement_difference(mine, settings(N3)) is None  # too old to say
    warned = entitlement_difference(mine, settings(N3, limits=replace(LIMITS, entitlement="None")))
    assert warned is not None
    assert warned.startswith("Entitlement differs from 10.0.0.3:9800's: Token here, None there")


def test_settings_from_a_config_carry_its_limits() -> None:
    config = Config.from_mapping({
        "ClusterMembers": "127.0.0.1:9000,127.0.0.1:9010,127.0.0.1:9020",
        "ClusterMemberListen": "127.0.0.1:9000", "ClusterPassword": "x",
        "MaxMessageSize": "5000", "MaxFrameSize": "9000", "Entitlement": "Basic",
        "EntitlementAllowToken": "t",
    })
    assert MemberSettings.from_config(config, "i").limits == MemberLimits(
        5000, 9000, "Basic", 604800)


def test_standard_members_have_no_seeds_to_disagree_on() -> None:
    """Standard: no Raft, so a seed count that follows the list's length (2 -> 3 members
    scaling up) or the first members' order do not matter; the list rule still does."""
    mine = settings(S0, delivery_mode="Standard", members=(S0, N3), seed_count=2)
    grown = settings(N3, delivery_mode="Standard", members=(S0, N3, N4), seed_count=3)
    assert disagreement(mine, grown) is None and disagreement(grown, mine) is None
    swapped = settings(N3, delivery_mode="Standard", members=(N3, S0), seed_count=2)
    assert "ClusterMembers differ" in (disagreement(mine, swapped) or "")


def test_a_member_beyond_the_end_of_the_peers_list_is_refused() -> None:
    """The prefix rule lets a longer list roll out, but not a member the peer does not
    list yet (a pod beyond the old maxReplicas): refused as before, now saying why."""
    mine, seed = settings(N4), settings(S0, members=(S0, S1, S2, N3))
    assert disagreement(mine, seed) == (
        "this member (10.0.0.4:9800) is not one of 10.0.0.0:9800's ClusterMembers: there "
        "[10.0.0.0:9800, 10.0.0.1:9800, 10.0.0.2:9800, 10.0.0.3:9800]"
    )
    assert disagreement(seed, mine) == (
        "10.0.0.4:9800 is not one of ClusterMembers here: [10.0.0.0:9800, 10.0.0.1:9800, "
        "10.0.0.2:9800, 10.0.0.3:9800]"
    )


def test_another_process_with_this_members_address_is_refused_by_both() -> None:
    me, impostor = settings(N3, incarnation="aaaa"), settings(N3, incarnation="bbbb")
    assert disagreement(me, impostor) == (
        "another process (incarnation bbbb) claims 10.0.0.3:9800, this member's "
        "ClusterMemberListen (this one is aaaa): two members configured with the same address"
    )
    assert disagreement(impostor, me) is not None
    assert disagreement(me, me) is None  # a member asking its own address finds itself


def test_allowed_differences_are_named_for_the_log() -> None:
    mine = settings(S0)
    assert soft_differences(mine, settings(N3)) == ()
    notes = soft_differences(mine, settings(N3, members=(*MEMBERS, N5), max_cached=10))
    assert notes[0].startswith("ClusterMembers of 10.0.0.3:9800 has 6 members, 5 here")
    assert notes[1].startswith(
        "MaxCachedMessagesPerSubject differs from 10.0.0.3:9800's: 1000 here, 10 there"
    )
    shorter = replace(LIMITS, mqtt_session_expiry=3600)
    assert soft_differences(settings(S0, limits=LIMITS), settings(N3, limits=shorter)) == (
        "MqttSessionExpiry differs from 10.0.0.3:9800's: 604800 here, 3600 there (allowed "
        "while a change rolls out: every member discards the persistent MQTT sessions it "
        "finds stale, so the shortest applies to a session whose client is away)",
    )
    assert soft_differences(settings(S0, limits=LIMITS), settings(N3)) == ()  # too old


def test_two_members_with_one_server_name_are_linked_with_a_warning() -> None:
    mine = settings(S0, server_name="migratory-0")
    twin = settings(N3, server_name="migratory-0")
    assert disagreement(mine, twin) is None  # nothing routes by ServerName
    assert name_clash(mine, twin) == (
        "ServerName 'migratory-0' is also 10.0.0.3:9800's: two members with one name in "
        "logs, audit and the clients' connected (set ServerName per member)"
    )
    assert name_clash(mine, settings(N3, server_name="migratory-3")) is None
    assert name_clash(mine, replace(mine, incarnation="self")) is None  # its own address


def test_long_lists_are_cut_in_the_text() -> None:
    many = tuple(f"10.1.0.{i}:9800" for i in range(40))
    found = disagreement(settings(S0, members=(S0, *many)), settings(N3, members=(S0, N3, *many)))
    assert found is not None and "... 29 more" in found and len(found) < 1000


def test_settings_from_a_config_apply_the_default_seed_count() -> None:
    def config(members: int) -> Config:
        names = ",".join(f"127.0.0.1:{9000 + 10 * i}" for i in range(members))
        return Config.from_mapping({
            "ClusterMembers": names, "ClusterMemberListen": "127.0.0.1:9000",
            "ClusterPassword": "x", "ClusterDeliveryMode": "Guaranteed",
            "ClusterDataDir": "unused", "ServerName": "m0",
        })

    four, five = (MemberSettings.from_config(config(n), "i") for n in (4, 5))
    assert (four.seed_count, five.seed_count, four.server_name) == (3, 5, "m0")
    # growing a list of 4 to 5 without ClusterSeedMemberCount changes the seeds: refused
    assert disagreement(four, replace(five, member=four.member)) is not None


def test_readiness_follows_the_majority_of_the_seeds() -> None:
    agreement = SeedAgreement(me=N3, seeds=(S0, S1, S2))
    assert agreement.reason() == "member is comparing its cluster settings with the seeds'"
    agreement.rounds = 1
    assert agreement.reason() is None  # no seed answered: nothing against it
    agreement.record(S0, None)
    agreement.record(S1, "ClusterDeliveryMode differs from 10.0.0.1:9800's: ...")
    assert agreement.reason() is None  # the one seed that disagrees is the odd one
    agreement.record(S2, "ClusterDeliveryMode differs from 10.0.0.2:9800's: ...")
    assert agreement.reason() == (
        "2 of the 3 seeds disagree: ClusterDeliveryMode differs from 10.0.0.1:9800's: ..."
    )
    agreement.forget(S2)  # could not be asked this time: counts for nothing
    assert agreement.reason() is None
    agreement.own_address = "another process (incarnation x) claims 10.0.0.3:9800, ..."
    assert agreement.reason() == agreement.own_address


def test_a_seed_starts_raft_once_a_majority_of_the_seeds_linked() -> None:
    """Readiness is lenient with seeds that could not be asked; a seed starting Raft is
    not: started before the others, it waits for their verdict. A non-seed only waits
    for nothing to stand against it (one seed it reaches is enough to serve from)."""
    seed = SeedAgreement(me=S0, seeds=(S0, S1, S2), rounds=1)
    assert seed.reason() is None and not seed.settled(majority=True)
    seed.record(S1, "differs")
    assert not seed.settled(majority=True)
    seed.record(S2, None)  # agrees, or too old to compare
    assert seed.settled(majority=True)  # itself and S2
    seed.own_address = "another process ..."
    assert not seed.settled(majority=True)
    non_seed = SeedAgreement(me=N3, seeds=(S0, S1, S2))
    assert not non_seed.settled(majority=False)  # no round yet
    non_seed.rounds = 1
    assert non_seed.settled(majority=False)
    non_seed.record(S0, "differs")
    non_seed.record(S1, "differs")
    assert not non_seed.settled(majority=False)


def test_a_seed_that_waits_says_what_it_learnt() -> None:
    """A seed rolled alone onto ClusterSeedMemberCount = 5 counts seeds that do not
    exist: the two that answer refuse it, a minority of five, so no reason() -- but its
    readiness must still name the setting (deploy/k8s/README.md, Scaling)."""
    five = (S0, S1, S2, N3, N4)
    seed = SeedAgreement(me=S2, seeds=five)
    assert seed.waiting() == "member is comparing cluster settings with the seeds"
    seed.rounds = 1
    seed.record(S0, "ClusterSeedMemberCount differs: 5 here, 3 there")
    seed.record(S1, "ClusterSeedMemberCount differs: 5 here, 3 there")
    assert seed.reason() is None and not seed.settled(majority=True)
    assert seed.waiting() == (
        "member is comparing cluster settings with the seeds; 2 of the 5 seeds disagree "
        "so far: ClusterSeedMemberCount differs: 5 here, 3 there; 2 of the 5 seeds not "
        "reached"
    )


def test_a_seed_counts_itself_as_agreeing() -> None:
    agreement = SeedAgreement(me=S0, seeds=(S0, S1, S2), rounds=1)
    agreement.record(S1, "differs")
    assert agreement.reason() is None
    agreement.record(S2, "differs")
    assert agreement.reason() is not None
    assert agreement.against() == {S1: "differs", S2: "differs"}


def test_repeated_refusals_are_logged_once_a_minute() -> None:
    repeats = Repeats(every=60)
    assert repeats.first("a", "why", 0.0)
    assert not repeats.first("a", "why", 59.0)
    assert repeats.first("a", "another reason", 59.0)
    assert repeats.first("b", "why", 59.0)
    assert repeats.first("a", "why", 60.0)
