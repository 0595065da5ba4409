"""A follower seed cut off from a leader that keeps its quorum: a command given to it
commits once its link is back (cluster/raft_forward.py), with three real seed Raft nodes
(:class:`~cluster.raft.RaftCoordination`, pysyncobj threads, TCP on 127.0.0.1).

One link is cut, both ways (:class:`CuttableTransport`): each end drops its connection
and the seed that dials no longer dials. Elections are slow here (2-2.5 s), so the cut
follower does not stand meanwhile: the leader keeps leading with the third seed, as a
link reset or one link of a partition leaves it. pysyncobj 0.3.17 dropped such a
command; its publishes then waited for the 10 s publish timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from listen_ports import seed_port

import cluster.raft as raft_module
from cluster.coordination import CommittedBatch, PublishRequest
from cluster.raft import RaftCoordination, RaftTimings
from cluster.raft_transport import SeedLinkTransport
from migratory.model.message import Message

TIMINGS = RaftTimings(election_min=2.0, election_max=2.5, heartbeat=0.05, connection_timeout=2.5)
SLOW = RaftTimings(election_min=4.0, election_max=4.5, heartbeat=0.05, connection_timeout=4.5)
"""The timings of the seed with the highest address: it stands last, so it follows a
leader it dials (pysyncobj: the higher address dials), which the handshake rule is about."""
WAIT = 20.0  # seconds before a wait fails the test (not a measure: a bound)


class CuttableTransport(SeedLinkTransport):
    """A seed's Raft transport whose links to the addresses in ``cut`` are down."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.cut: set[str] = set()
        super().__init__(*args, **kwargs)

    def _shouldConnect(self, node: Any) -> bool:
        return node.address not in self.cut and bool(super()._shouldConnect(node))

    def _onTick(self) -> None:
        for node, connection in list(self._connections.items()):
            if getattr(node, "address", None) in self.cut:
                connection.disconnect()  # (the Raft thread's own)
        super()._onTick()


def wait_for(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT:g} s: {what}"
        time.sleep(0.02)


def ticked(node: RaftCoordination) -> None:
    """Wait for two more statuses of ``node``: its Raft thread ticked since (it publishes
    one after a tick, every 50 ms at most)."""
    for _ in range(2):
        at = node.snapshot.at
        wait_for(lambda at=at: node.snapshot.at > at, "a tick")


class Seeds:
    def __init__(self) -> None:
        ports = [seed_port() for _ in range(3)]
        addresses = [("127.0.0.1", p) for p in ports]
        self.committed: dict[str, list[CommittedBatch]] = {}
        self.nodes: list[RaftCoordination] = []
        for address in addresses:
            batches: list[CommittedBatch] = []
            node = RaftCoordination(
                self_address=address, seed_addresses=addresses, password="x",
                on_commit=batches.append, timings=SLOW if address == max(addresses) else TIMINGS,
            )
            self.committed[node.address] = batches
            self.nodes.append(node)

    def leader(self) -> RaftCoordination:
        wait_for(lambda: any(n.snapshot.state == "leader" for n in self.nodes), "a leader")
        leader = next(n for n in self.nodes if n.snapshot.state == "leader")
        wait_for(lambda: all(n.snapshot.leader == leader.address for n in self.nodes),
                 "every seed follows the leader")
        return leader

    def transport(self, node: RaftCoordination) -> CuttableTransport:
        transport: CuttableTransport = node.syncobj._SyncObj__transport
        return transport

    def cut(self, a: RaftCoordination, b: RaftCoordination, *, down: bool) -> None:
        for one, other in ((a, b), (b, a)):
            cut = self.transport(one).cut
            cut.add(other.address) if down else cut.discard(other.address)
        if down:
            wait_for(lambda: b.address not in a.snapshot.linked
                     and a.address not in b.snapshot.linked, "the link down")

    def commits_of(self, ref: int) -> list[int]:
        """On each seed, how many times a publish with ``ref`` was committed."""
        return [
            sum(1 for b in batches for origin in b.origins if origin == ("test", ref))
            for batches in self.committed.values()
        ]

    def close(self) -> None:
        for node in self.nodes:
            node.close()


@pytest.fixture
def seeds(monkeypatch: pytest.MonkeyPatch) -> Iterator[Seeds]:
    monkeypatch.setattr(raft_module, "SeedLinkTransport", CuttableTransport)
    made = Seeds()
    try:
        yield made
    finally:
        made.close()


def submit(node: RaftCoordination, ref: int, send_by: float | None = None) -> tuple[
    threading.Event, list[Any]
]:
    done, outcome = threading.Event(), []

    def on_done(clsn: int | None, error: str | None, unknown: bool) -> None:
        outcome.append((error, unknown))
        done.set()

    request = PublishRequest("test", ref, Message("/held/forward", b"%d" % ref))
    node.submit(1, [request], on_done, send_by=send_by)
    return done, outcome


def test_a_command_given_to_a_cut_off_follower_commits_once_the_link_is_back(
    seeds: Seeds,
) -> None:
    """Each follower in turn: first the one that dials the leader (its link is TCP
    "connected" before pysyncobj's handshake is done), then the one the leader dials."""
    leader = seeds.leader()
    followers = sorted((n for n in seeds.nodes if n is not leader), key=lambda n: n.address)
    assert followers[-1].address > leader.address, "the slow seed leads"
    term = leader.snapshot.term
    for ref, follower in enumerate(reversed(followers), start=1):
        seeds.cut(leader, follower, down=True)
        done, outcome = submit(follower, ref)
        ticked(follower)  # its Raft thread took the command (forwarded: the link is down)
        seeds.cut(leader, follower, down=False)
        assert done.wait(WAIT), f"the command never committed (dropped) on {follower.address}"
        assert outcome == [(None, False)]
        wait_for(lambda ref=ref: all(seeds.commits_of(ref)), "every seed applies it")
        assert seeds.commits_of(ref) == [1, 1, 1]  # exactly once
        wait_for(lambda f=follower: f.snapshot.forward_hold["released"] == 1, "its status")
    assert (leader.snapshot.state, leader.snapshot.term) == ("leader", term)  # no election


def test_a_held_command_whose_caller_gave_up_is_never_sent(seeds: Seeds) -> None:
    leader = seeds.leader()
    follower = next(n for n in seeds.nodes if n is not leader)
    seeds.cut(leader, follower, down=True)
    done, outcome = submit(follower, 1, send_by=time.monotonic() + 0.2)
    assert done.wait(WAIT), "the command neither committed nor failed"
    assert outcome == [("LEADER_UNREACHABLE", False)]  # definite: PUBLISH_FAILED
    seeds.cut(leader, follower, down=False)
    later, later_outcome = submit(follower, 2)
    assert later.wait(WAIT) and later_outcome == [(None, False)]
    wait_for(lambda: all(seeds.commits_of(2)), "every seed applies the later one")
    assert seeds.commits_of(1) == [0, 0, 0]  # the held one was never sent
    wait_for(lambda: follower.snapshot.forward_hold["expired"] == 1, "its status")
