"""Inconsistently configured members on real loopback links (trio, in process): the
link is refused and both sides say why, naming the key and both values; allowed
differences link; older peers (no settings) still link; the agreement probe turns the
seeds' verdicts, and another process at a member's own address, into its readiness.
(cluster/link_io.py, cluster/peers.py, cluster/agreement_probe.py; the rule itself is
tests/cluster/test_agreement.py.)"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest
import trio
from listen_ports import listen_port

from cluster import link, link_ops
from cluster.agreement import MemberLimits, MemberSettings
from cluster.agreement_probe import AgreementProbe
from cluster.coordination import UNNUMBERED_EPOCH
from cluster.link_io import Disagreement, connect, speaks_tls
from cluster.peers import PeerService
from cluster.publishing import ClusterPublishing
from cluster.replica import Replica
from cluster.seed_progress import SeedProgress
from cluster.stream import CommittedStream
from migratory.server.hub import Hub

PASSWORD = "agreement-password"
LIMITS = MemberLimits(max_message_size=131072, max_frame_size=1048576, entitlement="None",
                      mqtt_session_expiry=604800)


def address(port: int) -> tuple[str, int]:
    return ("127.0.0.1", port)


def name(port: int) -> str:
    return f"127.0.0.1:{port}"


def settings_of(port: int, ports: list[int], **changes: Any) -> MemberSettings:
    base = MemberSettings(
        member=name(port), members=tuple(name(p) for p in ports), seed_count=3,
        delivery_mode="Guaranteed", max_cached=1000, incarnation=f"p{port}",
        limits=LIMITS,
    )
    return replace(base, **changes)


def service(
    port: int, settings: MemberSettings | None, password: str = PASSWORD, *, peers: int = 0
) -> PeerService:
    """``settings`` None: an older member, whose ClusterMembers are ``peers`` and itself."""
    members = frozenset(settings.members) if settings is not None else frozenset(
        {name(port), name(peers)})
    return PeerService(
        name=name(port), members=members, password=password,
        stream=CommittedStream(ClusterPublishing(
            origin="me#1", replica=Replica(Hub(epoch=UNNUMBERED_EPOCH)))),
        take_forward=lambda peer, requests: None, settings=settings,
    )


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


async def with_services(services: list[tuple[int, PeerService]], body: Any) -> Any:
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            for port, peer_service in services:
                await nursery.start(peer_service.run, address(port))
            result = await body()
            nursery.cancel_scope.cancel()
    return result


async def dial(
    port: int, settings: MemberSettings | None, password: str = PASSWORD, member: str = ""
) -> str:
    """How a link from ``settings`` (or ``member`` without) to the member on ``port``
    goes: "linked" (after a Replicate answered by a heartbeat) or the refusal."""
    member = settings.member if settings is not None else member
    try:
        channel = await connect(address(port), member=member, password=password,
                                settings=settings, max_frame=link.MAX_FRAME)
    except Disagreement as exc:
        return exc.reason
    try:
        await channel.send(link.Replicate(0))
        assert await channel.receive() == link.Heartbeat(0, True)
    finally:
        await channel.aclose()
    return "linked"


@pytest.fixture
def ports() -> list[int]:
    return [listen_port() for _ in range(5)]  # 4 members, a fifth address


@pytest.mark.parametrize(("change", "odd_says", "seed_says"), [
    pytest.param({"order": [0, 2, 1, 3]}, "ClusterMembers differ from {seed}'s (the seeds "
                 "differ): here [{0}, {2}, {1}, {3}], there [{0}, {1}, {2}, {3}]",
                 "ClusterMembers differ from {3}'s (the seeds differ): here [{0}, {1}, {2}, "
                 "{3}], there [{0}, {2}, {1}, {3}]", id="seeds"),
    pytest.param({"order": [0, 1, 2, 4, 3]}, "ClusterMembers differ from {seed}'s (only "
                 "members added or removed at the end may differ while a change rolls out): "
                 "here [{0}, {1}, {2}, {4}, {3}], there [{0}, {1}, {2}, {3}]",
                 "ClusterMembers differ from {3}'s (only members added or removed at the end "
                 "may differ while a change rolls out): here [{0}, {1}, {2}, {3}], there "
                 "[{0}, {1}, {2}, {4}, {3}]", id="one more in the middle"),
    pytest.param({"delivery_mode": "Standard"}, "ClusterDeliveryMode differs from {seed}'s: "
                 "Standard here, Guaranteed there", "ClusterDeliveryMode differs from {3}'s: "
                 "Guaranteed here, Standard there", id="mode"),
    pytest.param({"seed_count": 5}, "ClusterSeedMemberCount differs from {seed}'s: 5 here, "
                 "3 there", "ClusterSeedMemberCount differs from {3}'s: 3 here, 5 there",
                 id="seed count"),
    pytest.param({"limits": replace(LIMITS, max_message_size=6000000, max_frame_size=8388608)},
                 "MaxMessageSize differs from {seed}'s: 6000000 here, 131072 there",
                 "MaxMessageSize differs from {3}'s: 131072 here, 6000000 there",
                 id="MaxMessageSize"),
    pytest.param({"limits": replace(LIMITS, max_frame_size=2097152)},
                 "MaxFrameSize differs from {seed}'s: 2097152 here, 1048576 there",
                 "MaxFrameSize differs from {3}'s: 1048576 here, 2097152 there",
                 id="MaxFrameSize"),
])
def test_a_member_configured_otherwise_is_refused_and_both_sides_say_why(
    caplog: pytest.LogCaptureFixture,
    ports: list[int],
    change: dict[str, Any],
    odd_says: str,
    seed_says: str,
) -> None:
    """Before: the seed took the link (the list and mode were never compared)."""
    caplog.set_level(logging.INFO)
    seed, odd = ports[0], ports[3]
    order = change.pop("order", range(4))  # 4: the fifth address
    odd_settings = settings_of(odd, [ports[i] for i in order], **change)
    seed_settings = settings_of(seed, ports[:4])

    async def body() -> tuple[str, str]:
        refused = await dial(seed, odd_settings)
        return refused, await dial(seed, settings_of(odd, ports[:4]))  # the right one links

    refused, fixed = trio.run(with_services, [(seed, service(seed, seed_settings))], body)
    names = [name(p) for p in ports]
    assert refused.startswith(odd_says.format(*names, seed=name(seed))), refused
    assert fixed == "linked"
    logged = [m for m in warnings(caplog) if "refused" in m]
    assert len(logged) == 1, logged
    assert logged[0].startswith(f"cluster link from {name(odd)} refused: "
                                f"{seed_says.format(*names)}"), logged


def test_a_longer_list_at_the_end_links_while_a_scale_up_rolls_out(
    caplog: pytest.LogCaptureFixture, ports: list[int]
) -> None:
    caplog.set_level(logging.INFO)
    seed, rolled = ports[0], ports[3]
    longer = settings_of(rolled, ports, max_cached=10)  # the fifth address at the end
    linked = trio.run(with_services, [(seed, service(seed, settings_of(seed, ports[:4])))],
                      lambda: dial(seed, longer))
    assert linked == "linked"
    notes = [r.getMessage() for r in caplog.records if "cluster settings:" in r.getMessage()]
    assert any(f"ClusterMembers of {name(rolled)} has 5 members, 4 here" in n for n in notes)
    assert any("MaxCachedMessagesPerSubject differs" in n for n in notes), notes
    assert warnings(caplog) == []


def test_two_members_with_one_server_name_link_and_both_warn(
    caplog: pytest.LogCaptureFixture, ports: list[int]
) -> None:
    caplog.set_level(logging.INFO)
    seed, twin = ports[0], ports[3]
    linked = trio.run(
        with_services, [(seed, service(seed, settings_of(seed, ports[:4], server_name="m")))],
        lambda: dial(seed, settings_of(twin, ports[:4], server_name="m")),
    )
    assert linked == "linked"
    clash = [m for m in warnings(caplog) if "ServerName 'm' is also" in m]
    assert sorted(clash) == sorted(
        f"cluster settings: ServerName 'm' is also {name(p)}'s: two members with one name "
        "in logs, audit and the clients' connected (set ServerName per member)"
        for p in (seed, twin)
    )


def test_a_wrong_password_is_named_on_both_sides(
    caplog: pytest.LogCaptureFixture, ports: list[int]
) -> None:
    """Before: the dialling member saw "peer closed the link" (logged at debug)."""
    caplog.set_level(logging.INFO)
    seed, odd = ports[0], ports[3]
    refused = trio.run(
        with_services, [(seed, service(seed, settings_of(seed, ports)))],
        lambda: dial(seed, settings_of(odd, ports), password="another-password"),
    )
    assert refused == (
        f"authentication failed: {name(seed)} closed the link on this member's proof "
        "(a different ClusterPassword?)"
    )
    assert warnings(caplog) == [
        f"cluster link refused: authentication failed: bad mac from '{name(odd)}' "
        "(wrong ClusterPassword or replay) (from 127.0.0.1)"
    ]


def test_members_of_an_older_version_still_link_both_ways(ports: list[int]) -> None:
    """An older member knows no Settings: a new one dialling it links again without them;
    a new acceptor takes an older member's first operation as its first operation."""
    old, new = ports[0], ports[1]

    async def body() -> tuple[str, str]:
        older = await dial(new, None, member=name(ports[3]))
        return await dial(old, settings_of(ports[3], ports)), older

    assert trio.run(with_services, [(old, service(old, None, peers=ports[3])),
                                    (new, service(new, settings_of(new, ports)))],
                    body) == ("linked", "linked")


def test_members_that_predate_the_limits_link_and_compare_the_rest(
    caplog: pytest.LogCaptureFixture, ports: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member of this link version from before MaxMessageSize, MaxFrameSize and
    Entitlement were in Settings decodes a ``cf`` strictly: it ends a link whose
    Settings carry them. A new member dialling it links again with its settings as the
    older member sends them (the rest still compared: another mode is still refused); a
    new acceptor answers an older connector without them."""
    caplog.set_level(logging.INFO)
    strict = link_ops._op

    def older_op(tag: str, body: dict[Any, Any]) -> link.LinkOp:  # an older decoder
        if tag == "cf" and "mm" in body:
            raise link.LinkError("'cf' frame: missing keys [], 4 unknown keys")
        return strict(tag, body)

    monkeypatch.setattr(link_ops, "_op", older_op)
    seed, odd = ports[0], ports[3]

    async def body() -> tuple[str, str, str]:
        new_to_old = await dial(seed, settings_of(odd, ports[:4]))
        other_mode = await dial(seed, settings_of(odd, ports[:4], delivery_mode="Standard"))
        old_to_new = await dial(seed, settings_of(odd, ports[:4], limits=None))
        return new_to_old, other_mode, old_to_new

    linked, refused, older = trio.run(
        with_services, [(seed, service(seed, settings_of(seed, ports[:4])))], body)
    assert (linked, older) == ("linked", "linked")
    assert refused.startswith("ClusterDeliveryMode differs"), refused
    assert not any("linking without comparing settings" in r.getMessage()
                   for r in caplog.records)


def test_another_entitlement_links_and_both_warn(
    caplog: pytest.LogCaptureFixture, ports: list[int]
) -> None:
    caplog.set_level(logging.INFO)
    seed, odd = ports[0], ports[3]
    linked = trio.run(
        with_services, [(seed, service(seed, settings_of(seed, ports[:4])))],
        lambda: dial(seed, settings_of(odd, ports[:4],
                                       limits=replace(LIMITS, entitlement="Token"))),
    )
    assert linked == "linked"
    assert sorted(m for m in warnings(caplog) if "Entitlement differs" in m) == sorted([
        f"cluster settings: Entitlement differs from {name(odd)}'s: None here, Token there "
        "(allowed while a change rolls out; until it has, a client is allowed on one member "
        "what another denies it, and a publish forwarded by a member is numbered without "
        "another entitlement check)",
        f"cluster settings: Entitlement differs from {name(seed)}'s: Token here, None there "
        "(allowed while a change rolls out; until it has, a client is allowed on one member "
        "what another denies it, and a publish forwarded by a member is numbered without "
        "another entitlement check)",
    ])


KEYS = (("EntitlementTokenKeyFile", "0123456789abcdef"), ("MonitorToken", "fedcba9876543210"))


def test_another_token_key_links_and_both_warn(
    caplog: pytest.LogCaptureFixture, ports: list[int]
) -> None:
    """Before, the token key, issuer, audience, plugin and MonitorToken were never
    compared: a member with another key accepted tokens the others denied, silently."""
    caplog.set_level(logging.INFO)
    seed, odd = ports[0], ports[3]
    rotated = (KEYS[0][0], "aaaaaaaaaaaaaaaa"), KEYS[1]
    linked = trio.run(
        with_services, [(seed, service(seed, settings_of(seed, ports[:4],
                                                         entitlement_keys=KEYS)))],
        lambda: dial(seed, settings_of(odd, ports[:4], entitlement_keys=rotated)),
    )
    assert linked == "linked"
    said = sorted(m for m in warnings(caplog) if "entitlement's keys differ" in m)
    assert [m.split(" (")[0] for m in said] == sorted(
        f"cluster settings: the entitlement's keys differ from {name(p)}'s: "
        "EntitlementTokenKeyFile" for p in (seed, odd)), said


def test_members_that_predate_the_entitlement_keys_link_and_compare_the_limits(
    caplog: pytest.LogCaptureFixture, ports: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member from before the keys were in Settings (h105's) ends a link whose ``cf``
    carries ``ek``: a new member dials it again without them -- its limits still compared
    (another MaxMessageSize still refused), not dropped with them."""
    caplog.set_level(logging.INFO)
    strict = link_ops._op

    def older_op(tag: str, body: dict[Any, Any]) -> link.LinkOp:  # h105's decoder
        if tag == "cf" and "ek" in body:
            raise link.LinkError("'cf' frame: missing keys [], 1 unknown keys")
        return strict(tag, body)

    monkeypatch.setattr(link_ops, "_op", older_op)
    seed, odd = ports[0], ports[3]
    bigger = replace(LIMITS, max_message_size=6000000, max_frame_size=8388608)

    async def body() -> tuple[str, str, str]:
        new_to_old = await dial(seed, settings_of(odd, ports[:4], entitlement_keys=KEYS))
        sizes = await dial(seed, settings_of(odd, ports[:4], limits=bigger,
                                             entitlement_keys=KEYS))
        old_to_new = await dial(seed, settings_of(odd, ports[:4]))  # sends no keys
        return new_to_old, sizes, old_to_new

    seed_settings = settings_of(seed, ports[:4], entitlement_keys=KEYS)
    linked, refused, older = trio.run(with_services, [(seed, service(seed, seed_settings))],
                                      body)
    assert (linked, older) == ("linked", "linked")
    assert refused.startswith("MaxMessageSize differs"), refused
    assert not any("linking without comparing settings" in r.getMessage()
                   for r in caplog.records)


def test_a_plain_member_is_not_taken_for_one_that_speaks_tls(
    caplog: pytest.LogCaptureFixture, ports: list[int]
) -> None:
    """(A member that does is in test_cluster_settings_differ.py, real processes.) The
    plain member takes the probe for a question: before, it warned that the prober had
    ClusterTls* keys set ("frame of 369295618 bytes ... (a TLS handshake: ...)")."""
    caplog.set_level(logging.DEBUG)
    seed = ports[0]

    async def body() -> tuple[bool, bool]:
        return await speaks_tls(address(seed)), await speaks_tls(address(ports[4]))

    assert trio.run(with_services, [(seed, service(seed, settings_of(seed, ports[:4])))],
                    body) == (False, False)  # a plain member; nobody there
    assert warnings(caplog) == []
    assert any("a TLS probe" in r.getMessage() for r in caplog.records)


def test_another_process_at_a_members_own_address_keeps_it_from_agreeing(
    caplog: pytest.LogCaptureFixture, ports: list[int]
) -> None:
    """Two members configured with one address: the one that does not answer there finds
    the other; it is not ready and never gets past wait_agreed (no Raft, no upstream)."""
    caplog.set_level(logging.INFO)
    real = settings_of(ports[3], ports, incarnation="real")
    impostor = replace(real, incarnation="impostor")
    probe = AgreementProbe(settings=impostor, seeds=[address(p) for p in ports[:3]],
                           own=address(ports[3]), password=PASSWORD, period=60,
                           max_frame=link.MAX_FRAME)

    async def body() -> bool:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe.run)
            with trio.move_on_after(0.3) as waited:
                await probe.wait_agreed(majority=False)
            nursery.cancel_scope.cancel()
        return waited.cancelled_caught

    assert trio.run(with_services, [(ports[3], service(ports[3], real))], body)
    assert probe.reason() == (
        f"another process (incarnation real) claims {name(ports[3])}, this member's "
        "ClusterMemberListen (this one is impostor): two members configured with the same "
        "address"
    )
    assert f"cluster link from {name(ports[3])} refused: another process (incarnation " \
        "impostor)" in " ".join(warnings(caplog))


def test_a_second_member_with_one_address_on_one_host_does_not_start(ports: list[int]) -> None:
    """Before: "migratory: Address already in use", naming nothing."""
    settings = settings_of(ports[3], ports)

    async def body() -> str:
        errors: list[str] = []
        try:
            await service(ports[3], settings).run(address(ports[3]))
        except* OSError as group:
            errors += [str(e) for e in group.exceptions]
        return errors[0] if errors else "started"

    assert trio.run(with_services, [(ports[3], service(ports[3], settings))], body) == (
        f"[Errno 98] cluster link 127.0.0.1:{ports[3]}: Address already in use "
        "(ClusterMemberBind / ClusterMemberListen: another member with this address on "
        "this host?)"
    )


@pytest.mark.parametrize(("odd_seeds", "ready"), [(0, True), (1, True), (2, False), (3, False)])
def test_the_probe_follows_the_majority_of_the_seeds(
    ports: list[int], odd_seeds: int, ready: bool
) -> None:
    """A member is not ready once a majority of the seeds disagree with it; one odd seed
    does not take it out."""
    seeds = ports[:3]
    services = [
        (p, service(p, settings_of(p, ports, delivery_mode="Standard" if i < odd_seeds
                                   else "Guaranteed")))
        for i, p in enumerate(seeds)
    ]
    probe = AgreementProbe(settings=settings_of(ports[3], ports),
                           seeds=[address(p) for p in seeds], own=address(ports[3]),
                           password=PASSWORD, period=60, max_frame=link.MAX_FRAME)

    async def body() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe.run)
            while probe.agreement.rounds == 0:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(with_services, services, body)
    assert len(probe.agreement.against()) == odd_seeds
    reason = probe.reason()
    if ready:
        assert reason is None
    else:
        assert reason is not None and reason.startswith(
            f"{odd_seeds} of the 3 seeds disagree: ClusterDeliveryMode differs from "
            f"{name(seeds[0])}'s: Guaranteed here, Standard there"
        )


@pytest.mark.parametrize("leads", [True, False], ids=["leader", "follower"])
def test_the_leader_names_a_seed_that_applies_nothing(
    caplog: pytest.LogCaptureFixture, ports: list[int], leads: bool
) -> None:
    """A seed that acknowledges the log and applies none of it (one started on a dump
    another version wrote) is not ready, and Raft cannot tell its leader. The leader's
    probe now asks each seed where it stands (a SyncRequest no one can serve, refused
    with the seed's clsn: cluster/seed_progress.py). Before: nothing named it."""
    caplog.set_level(logging.INFO)
    stuck = ports[0]  # its stream applied nothing: clsn 0, while the leader is at 40
    progress = SeedProgress(stuck_seconds=0.3)
    probe = AgreementProbe(settings=settings_of(ports[3], ports), seeds=[address(stuck)],
                           own=address(ports[3]), password=PASSWORD, period=0.1,
                           max_frame=link.MAX_FRAME, progress=progress,
                           leading=lambda: 40 if leads else None)

    async def body() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe.run)
            while not progress.stuck() and probe.agreement.rounds < (30 if leads else 8):
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()

    trio.run(with_services, [(stuck, service(stuck, settings_of(stuck, ports)))], body)
    named = [m for m in warnings(caplog) if "applies nothing" in m]
    if not leads:
        assert (named, progress.stuck(), progress.seen) == ([], {}, {})
        return
    assert progress.stuck() == {name(stuck): 0}
    assert len(named) == 1 and named[0].startswith(
        f"cluster: seed {name(stuck)} applies nothing: it has stood at clsn 0 for "), named
    assert "while this Raft leader applied up to 40" in named[0]
