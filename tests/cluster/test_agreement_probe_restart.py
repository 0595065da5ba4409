"""The agreement probe when a whole cluster restarts at once (cluster/agreement_probe.py,
cluster/agreement.py ``SeedAgreement.compared``): a seed whose majority has agreed starts
its role without waiting for a round's slowest question, and a seed that comes up while
that question is out is asked again within the round.

The slow seed here is a port that takes the TCP dial and never answers (a member
process stopped, or starved on a box far busier than its cores): its question lasts
``ASK_TIMEOUT`` (12 s). Counted, not timed: the round has not ended (``rounds == 0``)
when the seed is settled, and the late seed was asked more than once in that round.
"""

from __future__ import annotations

import socket

import trio
import trio.testing
from listen_ports import listen_port
from test_cluster_agreement_links import PASSWORD, address, name, service, settings_of

from cluster import link
from cluster.agreement import SeedAgreement
from cluster.agreement_probe import ASK_TIMEOUT, AgreementProbe


def silent_seed(port: int) -> socket.socket:
    """A listening socket nobody accepts on: the dial succeeds, nothing is ever said."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address(port))
    sock.listen(8)
    return sock


class CountingProbe(AgreementProbe):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.asked: dict[str, int] = {}

    async def _ask(self, address: tuple[str, int]) -> bool:
        key = f"{address[0]}:{address[1]}"
        self.asked[key] = self.asked.get(key, 0) + 1
        return await super()._ask(address)


def test_a_seed_starts_once_a_majority_agreed_not_when_a_silent_seeds_question_ends() -> None:
    """Seeds 0 (the probe's own), 1 (up 0.5 s after the probe began: its first dial is
    refused) and 2 (silent). Before: the probe asked seed 1 again only in the next round,
    after seed 2's question timed out (ASK_TIMEOUT), and wait_agreed looked only at the
    end of a round: seed 0 started Raft ~12 s late, whatever seed 1 said."""
    ports = [listen_port() for _ in range(4)]
    seeds = ports[:3]
    own = service(seeds[0], settings_of(seeds[0], ports))
    late = service(seeds[1], settings_of(seeds[1], ports))
    probe = CountingProbe(settings=settings_of(seeds[0], ports),
                          seeds=[address(p) for p in seeds], own=address(seeds[0]),
                          password=PASSWORD, period=60, max_frame=link.MAX_FRAME)
    silent = silent_seed(seeds[2])
    settled_in_round = []

    async def main() -> None:
        with trio.fail_after(ASK_TIMEOUT + 5):
            async with trio.open_nursery() as nursery:
                await nursery.start(own.run, address(seeds[0]))
                nursery.start_soon(probe.run)
                await trio.sleep(0.5)
                await nursery.start(late.run, address(seeds[1]))
                with trio.move_on_after(ASK_TIMEOUT / 2):
                    await probe.wait_agreed(majority=True)
                    settled_in_round.append(probe.agreement.rounds)
                nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        silent.close()
    assert settled_in_round == [0]  # before: [] (still waiting for the round's end)
    assert probe.asked[name(seeds[1])] >= 2  # refused, then asked again in the round
    assert probe.asked[name(seeds[2])] == 1  # (still out)
    assert probe.reason() is None
    assert probe.agreement.waiting().startswith("member is comparing")


S0, S1, S2, N3 = (f"10.0.0.{i}:9800" for i in range(4))


def test_before_a_round_ends_a_majority_that_agreed_settles_and_nothing_less() -> None:
    seed = SeedAgreement(me=S0, seeds=(S0, S1, S2))
    seed.record(S1, None)
    assert not seed.compared() and not seed.settled(majority=True)  # own address unheard
    seed.own_checked = True
    assert seed.compared() and seed.reason() is None and seed.settled(majority=True)
    seed.own_address = "another process (incarnation x) claims 10.0.0.0:9800, ..."
    assert not seed.settled(majority=True)
    alone = SeedAgreement(me=S0, seeds=(S0, S1, S2), own_checked=True)
    alone.record(S1, "differs")
    assert not alone.compared()  # one of three: a majority could still disagree
    alone.record(S2, None)
    assert alone.compared() and alone.reason() is None  # itself and S2: 2 of 3 agree
    non_seed = SeedAgreement(me=N3, seeds=(S0, S1, S2), own_checked=True)
    non_seed.record(S0, None)
    assert not non_seed.compared() and not non_seed.settled(majority=False)
    non_seed.record(S1, None)
    assert non_seed.compared() and non_seed.settled(majority=False)


class ScriptedProbe(AgreementProbe):
    """Questions without sockets: ``script[port]`` gives each question to that seed in
    turn as (seconds it lasts, whether it was asked); the last entry repeats. Records the
    questions a round's end cut off while under way (a link dropped mid-handshake: with
    TLS, the seed logged 'cluster link refused: TLS handshake failed: UNEXPECTED_EOF')."""

    def __init__(self, script: dict[int, list[tuple[float, bool]]], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.script = script
        self.cut: list[int] = []
        self.asked: list[tuple[int, int]] = []  # (port, round)

    async def _ask(self, address: tuple[str, int]) -> bool:
        port = address[1]
        steps = self.script[port]
        seconds, asked = steps.pop(0) if len(steps) > 1 else steps[0]
        self.asked.append((port, self.agreement.rounds))
        try:
            await trio.sleep(seconds)
        except trio.Cancelled:
            self.cut.append(port)
            raise
        if asked and address == self.targets[0]:
            self.agreement.own_checked = True
        elif asked:
            self.agreement.record(name(port), None)
        self._wake()
        return asked


def test_a_question_under_way_when_the_round_ends_is_not_cut_off() -> None:
    """Seed 1 refuses the first dial (still starting), seed 2's question lasts 0.4 s (a
    busy seed). Seed 1 is asked again at 0.3 s and its question -- a dial and a TLS
    handshake -- lasts 0.2 s. Before: the round ended when seed 2's question did, at
    0.4 s, and cancelled seed 1's question under way: its link closed in the middle of
    the TLS handshake (the seed logged a refused link, UNEXPECTED_EOF: the warning
    test_cluster_tls.py's failover test caught 1 run in 5 at load 18 on 2 cores) and its
    answer was lost until the next round. Now a round's end stops the retries that wait,
    and a question under way ends as a question does (within ASK_TIMEOUT)."""
    ports = [listen_port() for _ in range(4)]
    seeds = ports[:3]
    script = {seeds[0]: [(0.0, True)], seeds[1]: [(0.0, False), (0.2, True)],
              seeds[2]: [(0.4, True)]}
    probe = ScriptedProbe(script, settings=settings_of(seeds[0], ports),
                          seeds=[address(p) for p in seeds], own=address(seeds[0]),
                          password=PASSWORD, period=60, max_frame=link.MAX_FRAME)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe.run)
            while probe.agreement.rounds < 1:
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert probe.cut == []  # before: [seeds[1]]
    assert probe.asked.count((seeds[1], 0)) == 2  # refused, then asked again in the round
    assert probe.agreement.verdicts.get(name(seeds[1]), "unheard") is None  # heard in round 0
