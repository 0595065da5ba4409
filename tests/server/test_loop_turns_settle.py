"""A lagging member's waiting resumes, settled, are answered through the loop's turns
(migratory/server/hub_settle.py, loop_turns.py), on real sockets of one server whose
hub is numbered elsewhere (a cluster member's): the message that catches the member up
with a herd of waiting clients no longer answers all of them in its own step. Counted,
never timed: recovered messages per turn of the loop; each client still gets every
message after its position once, in order, then DATA_SYNC, then the live ones -- those
applied while the herd is answered included."""

from __future__ import annotations

import socket

import trio
from test_loop_turns import Turns, count_recovered

from migratory.config import Config
from migratory.listeners import OPEN_LISTENER
from migratory.model.message import Message, MessageType, Qos, new_message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import handshake_request, new_websocket_key
from migratory.server.app import Server
from migratory.server.connection import OPERATIONS_PER_TURN, Connection
from migratory.server.loop_turns import TURN_UNITS
from migratory.server.session_subscriptions import MESSAGES_PER_UNIT

CLIENTS = 200
SUBJECT = "/Lag/herd"
EPOCH = 11
APPLIED = 300  # what the member holds when the clients come
CAUGHT_UP = 700  # a cache sync takes it there: past every client's position
LAST = 800  # applied one a turn while the herd is answered


def numbered(seq: int) -> Message:
    return new_message(SUBJECT, b"m%d" % seq, {}, False, Qos.STANDARD, None, EPOCH, seq,
                       MessageType.UPDATE)


def position_of(n: int) -> int:
    return 400 + n % 50  # ahead of the member: the resume waits


class Reader:
    """One client's stream, decoded as it comes: its messages' seqs, its statuses."""

    def __init__(self) -> None:
        self.decoder = ws.FrameDecoder(client_frames=False)
        self.seqs: list[int] = []
        self.statuses: list[ops.Status] = []

    def take(self, data: bytes) -> None:
        self.decoder.receive_data(data)
        while (event := self.decoder.next_event()) is not None:
            op = ops.decode_server_op(event.data)  # type: ignore[union-attr]
            if isinstance(op, ops.Deliver):
                self.seqs.extend(m.seq for m in op.messages)
            elif isinstance(op, ops.SubjectStatus):
                self.statuses.append(op.status)


def test_a_lagging_member_answers_its_waiting_herd_a_bounded_slice_per_turn() -> None:
    """200 clients wait 100-149 messages ahead of the member; a cache sync from a peer
    takes it 400 further. Before, the sync's install step answered all 200 resumes,
    each with the 251-300 messages it jumped over (55,000 recovered messages in one
    turn). Now each session answers its own in its turns: a turn recovers at most about
    TURN_UNITS worth, and each client still gets everything once, in order."""
    server = Server(Config.defaults())
    hub = server.ctx.hub
    hub.numbered_elsewhere = True
    for seq in range(1, APPLIED + 1):
        hub.apply(numbered(seq), 0.0)
    pairs = [socket.socketpair() for _ in range(CLIENTS)]
    for n, (ours, theirs) in enumerate(pairs):
        ours.setblocking(False)
        resume = ops.Subscribe((ops.SubscriptionRequest(
            SUBJECT, position=Position(EPOCH, position_of(n))),))
        theirs.sendall(handshake_request("127.0.0.1", "/", new_websocket_key())
                       + ws.encode_masked_binary(ops.encode_client_op(ops.Connect("c")), b"mask")
                       + ws.encode_masked_binary(ops.encode_client_op(resume), b"mask"))
    turns = Turns()
    recovered = count_recovered(hub, turns, "_resume_from")  # messages, by turn of the loop
    readers = [Reader() for _ in range(CLIENTS)]
    state = hub._subjects[SUBJECT]

    async def read(reader: Reader, theirs: socket.socket) -> None:
        sock = trio.socket.from_stdlib_socket(theirs)
        while not reader.seqs or reader.seqs[-1] < LAST:
            data = await sock.recv(1 << 20)
            assert data
            reader.take(data[data.index(b"\r\n\r\n") + 4:] if data.startswith(b"HTTP")
                        else data)

    async def main() -> None:
        trio.lowlevel.add_instrument(turns)
        with trio.fail_after(60):  # (a hang, not a speed: nothing here is timed)
            async with trio.open_nursery() as nursery:
                server._nursery = nursery
                nursery.start_soon(server._batch_loop)
                nursery.start_soon(server._idle_write_loop)
                for ours, _ in pairs:
                    connection = Connection(server, ours, "127.0.0.1:1", OPEN_LISTENER)
                    server.connections.add(connection)
                    nursery.start_soon(connection.run)
                while len(state.waiting) < CLIENTS:
                    await trio.sleep(0.01)
                async with trio.open_nursery() as clients:
                    for reader, (_, theirs) in zip(readers, pairs, strict=True):
                        clients.start_soon(read, reader, theirs)
                    # a sync from a peer (cluster/cache_sync.py's install slice)
                    hub.reposition(SUBJECT, Position(EPOCH, CAUGHT_UP), None,
                                   [numbered(s) for s in range(1, CAUGHT_UP + 1)],
                                   trio.current_time())
                    for seq in range(CAUGHT_UP + 1, LAST + 1):  # then one a turn
                        await trio.lowlevel.checkpoint()
                        hub.apply(numbered(seq), trio.current_time())
                        server.wake_idle_writes()
                nursery.cancel_scope.cancel()

    trio.run(main)
    for ours, theirs in pairs:
        ours.close()
        theirs.close()
    for n, reader in enumerate(readers):
        assert reader.seqs == list(range(position_of(n) + 1, LAST + 1)), n
        assert reader.statuses == [ops.Status.SUBSCRIBE_ALLOW, ops.Status.DATA_SYNC], n
    assert sum(recovered.values()) >= CLIENTS * 250
    bound = (TURN_UNITS + 2 * OPERATIONS_PER_TURN) * MESSAGES_PER_UNIT
    assert max(recovered.values()) <= bound, max(recovered.values())
    assert len(recovered) > 5  # they took turns
