"""The event loop's work per turn, over every connection, is bounded; the connections
left over wait their turn in order (migratory/server/loop_turns.py). Counted, never
timed: recovered messages per turn of the loop, units per turn."""

from __future__ import annotations

import random
import socket
from collections import Counter
from typing import Any

import trio

from migratory.config import Config
from migratory.listeners import OPEN_LISTENER
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import handshake_request, new_websocket_key
from migratory.server.app import Server
from migratory.server.connection import OPERATIONS_PER_TURN, Connection
from migratory.server.loop_turns import TURN_UNITS, TurnBudget
from migratory.server.session_subscriptions import MESSAGES_PER_UNIT, SLICE_MESSAGES

CLIENTS = 200
SUBJECTS = [f"/Herd/s{i}" for i in range(10)]
CACHED = 500


def test_a_turn_lets_in_fresh_connections_first_and_one_coming_back() -> None:
    budget: TurnBudget[str] = TurnBudget(per_turn=4, step=2, fresh_step=1)
    assert budget.enter()
    budget.paid(4, 0)  # a connection did a whole turn's worth
    assert not budget.enter()
    for name in ("a", "b", "c"):
        budget.wait(name, fresh=False)
    for name in ("x", "y", "z"):
        budget.wait(name, fresh=True)
    assert budget.new_turn() == ["a", "x", "y"]  # one coming back, then the newcomers
    assert not budget.enter()  # a newcomer waits: none overtakes those waiting
    budget.leave("z")
    assert budget.new_turn() == ["b", "c"]
    assert budget.new_turn() == []
    assert budget.enter()
    assert budget.statistics()["waited"] == 6


def test_reservations_are_paid_back_with_the_work_done() -> None:
    budget: TurnBudget[str] = TurnBudget(per_turn=10, step=4, fresh_step=4)
    budget.paid(10, 0)
    budget.wait("a", fresh=True)
    budget.wait("b", fresh=True)
    budget.wait("c", fresh=True)
    assert budget.new_turn() == ["a", "b", "c"]  # 12 reserved, over 10
    budget.paid(1, 4)
    budget.paid(1, 4)
    budget.paid(1, 4)
    assert budget.spent == 3 and budget.done == 3 and budget.enter()
    assert budget.largest == 10


class Turns(trio.abc.Instrument):
    """Counts the loop's turns as the server's gate does (``after_io_wait``)."""

    def __init__(self) -> None:
        self.turn = 0

    def after_io_wait(self, timeout: float) -> None:
        self.turn += 1


def count_recovered(hub: Any, turns: Turns, start: str) -> Counter[int]:
    """Messages recovered by turn of the loop: ``hub.<start>`` (a resume's first slice)
    and ``hub.continue_resume`` (the next ones) counted as they answer."""
    recovered: Counter[int] = Counter()

    def counted(call: Any) -> Any:
        def count(*args: Any, **keywords: Any) -> Any:
            answer, cursor = call(*args, **keywords)
            recovered[turns.turn] += sum(
                len(op.messages) for op in answer if isinstance(op, ops.Deliver))
            return answer, cursor
        return count

    setattr(hub, start, counted(getattr(hub, start)))
    hub.continue_resume = counted(hub.continue_resume)
    return recovered


def test_a_herd_resuming_from_their_own_positions_is_answered_a_bounded_slice_per_turn() -> None:
    """200 clients, ready at once, each resuming 10 subjects from its own position 250-499
    messages back: every client had its whole answer in its first step, all in the
    first turn of the loop (40 clients: 148,953 messages recovered in one turn; 5,000
    such clients stopped the loop for 23-45 s: docs/benchmarks.md). Now a turn recovers at most
    about TURN_UNITS worth, and still every client gets each of its DATA_SYNC."""
    server = Server(Config.defaults())
    hub = server.ctx.hub
    for subject in SUBJECTS:
        for _ in range(CACHED):
            hub.publish(Message(subject, b"x"), 0.0)
    rng = random.Random(5)
    pairs = [socket.socketpair() for _ in range(CLIENTS)]
    resumes = []
    for ours, theirs in pairs:
        ours.setblocking(False)
        resume = ops.Subscribe(tuple(
            ops.SubscriptionRequest(s, position=Position(hub.epoch, rng.randrange(1, 250)))
            for s in SUBJECTS))
        resumes.append(ws.encode_masked_binary(ops.encode_client_op(resume), b"mask"))
        theirs.sendall(handshake_request("127.0.0.1", "/", new_websocket_key())
                       + ws.encode_masked_binary(ops.encode_client_op(ops.Connect("c")), b"mask"))
    turns = Turns()
    recovered = count_recovered(hub, turns, "start_resume")
    synced = [0] * CLIENTS

    async def read(n: int, theirs: socket.socket) -> None:
        sock = trio.socket.from_stdlib_socket(theirs)
        tail = b""
        while synced[n] < len(SUBJECTS):
            data = await sock.recv(1 << 20)
            assert data
            both = tail + data
            synced[n] += both.count(b"DATA_SYNC") - tail.count(b"DATA_SYNC")
            tail = both[-9:]

    async def main() -> None:
        trio.lowlevel.add_instrument(turns)
        with trio.fail_after(60):  # (a hang, not a speed: nothing here is timed)
            async with trio.open_nursery() as nursery:
                server._nursery = nursery
                connections = []
                for ours, _ in pairs:
                    connection = Connection(server, ours, "127.0.0.1:1", OPEN_LISTENER)
                    server.connections.add(connection)
                    connections.append(connection)
                    nursery.start_soon(connection.run)
                while not all(c.session.connected for c in connections):
                    await trio.sleep(0.01)
                for _, theirs in pairs:
                    answer = theirs.recv(1 << 20)  # the handshake's and `connected`
                    assert answer.startswith(b"HTTP/1.1 101 ") and b"DATA_SYNC" not in answer
                for (_, theirs), resume in zip(pairs, resumes, strict=True):
                    theirs.sendall(resume)  # all at once: ready in the same turn
                async with trio.open_nursery() as readers:
                    for n, (_, theirs) in enumerate(pairs):
                        readers.start_soon(read, n, theirs)
                nursery.cancel_scope.cancel()

    trio.run(main)
    for ours, theirs in pairs:
        ours.close()
        theirs.close()
    assert synced == [len(SUBJECTS)] * CLIENTS
    assert sum(recovered.values()) > CLIENTS * 10 * 250
    bound = (TURN_UNITS + 2 * OPERATIONS_PER_TURN) * MESSAGES_PER_UNIT
    assert max(recovered.values()) <= bound, max(recovered.values())
    # a turn passes its budget by one step at most, and the first answer of a step
    most = TURN_UNITS + OPERATIONS_PER_TURN + 1 + SLICE_MESSAGES // MESSAGES_PER_UNIT
    assert server.turns.budget.largest <= most, server.turns.budget.largest
    assert server.turns.budget.waited > CLIENTS  # they took turns
