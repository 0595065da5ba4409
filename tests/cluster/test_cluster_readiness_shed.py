"""cluster.readiness.keep_house: when a member that stopped being ready sends its
clients away, and when it leaves that to its own drain (a seed leaving after its Raft
node stopped). No sockets: a fake server, trio's MockClock."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from cluster.readiness import SHED_AFTER, keep_house


class FakePublishing:
    def expire(self, now: float) -> None:
        pass


class FakeServer:
    def __init__(self) -> None:
        self.shed: list[tuple[int, str]] = []

    def shed_clients(self, code: int, reason: str) -> int:
        self.shed.append((code, reason))
        return 3


class Reason:
    """Ready until :meth:`stop`, then "Raft stopped"."""

    def __init__(self) -> None:
        self.value: str | None = None

    def reason(self) -> str | None:
        return self.value


@pytest.mark.parametrize("leaving", [False, True])
def test_clients_are_shed_after_a_while_not_ready_unless_the_member_is_leaving(
    leaving: bool,
) -> None:
    """Leaving (its Raft node stopped, cluster/node.py): its drain tells the clients
    once their publishes have outcomes, up to 5 s; shedding at SHED_AFTER (3 s) cut
    them with 1013 before, their publishes unanswered. Not leaving: shed as before."""
    server, readiness = FakeServer(), Reason()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: keep_house(
                "member m", FakePublishing(), readiness, server,  # type: ignore[arg-type]
                leaving=lambda: leaving,
            ))
            await trio.sleep(2)  # ready
            readiness.value = "Raft stopped (disk full)"
            await trio.sleep(SHED_AFTER + 5)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    expected: list[Any] = [] if leaving else [
        (1013, "member cut off from the cluster: Raft stopped (disk full)")]
    assert server.shed == expected
