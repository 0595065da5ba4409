"""Where a herd of resumes from different positions spends the event loop: cProfile of
one server in this process (no listener: a socket pair per client) while 300 clients,
connected beforehand, each resume 10 of 100 subjects from their own positions 1-100
messages back, all at once, until each has its 10 DATA_SYNC::

    .venv/bin/python benchmarks/resume_herd_profile.py

docs/benchmarks.md, "A herd of resumes from different positions".
"""

from __future__ import annotations

import cProfile
import pstats
import random
import socket

import trio

from migratory.config import Config
from migratory.listeners import OPEN_LISTENER
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import handshake_request, new_websocket_key
from migratory.server.app import Server
from migratory.server.connection import Connection

SUBJECTS = [f"/Herd/s{i}" for i in range(100)]
CLIENTS = 300


def main() -> None:
    server = Server(Config.defaults())
    hub = server.ctx.hub
    for subject in SUBJECTS:
        for _ in range(1000):
            hub.publish(Message(subject, b"x" * 100), 0.0)
    rng = random.Random(5)
    pairs = [socket.socketpair() for _ in range(CLIENTS)]
    resumes = []
    for ours, theirs in pairs:
        ours.setblocking(False)
        resume = ops.Subscribe(tuple(
            ops.SubscriptionRequest(s, position=Position(hub.epoch, 1000 - rng.randint(1, 100)))
            for s in rng.sample(SUBJECTS, 10)))
        resumes.append(ws.encode_masked_binary(ops.encode_client_op(resume), b"mask"))
        theirs.sendall(handshake_request("127.0.0.1", "/", new_websocket_key())
                       + ws.encode_masked_binary(ops.encode_client_op(ops.Connect("c")), b"mask"))
    synced = [0] * CLIENTS
    profile = cProfile.Profile()

    async def read(n: int, theirs: socket.socket) -> None:
        sock = trio.socket.from_stdlib_socket(theirs)
        tail = b""
        while synced[n] < 10:
            both = tail + await sock.recv(1 << 20)
            synced[n] += both.count(b"DATA_SYNC") - tail.count(b"DATA_SYNC")
            tail = both[-9:]

    async def herd() -> None:
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
                theirs.recv(1 << 20)  # the handshake's answer and `connected`
            profile.enable()
            for (_, theirs), resume in zip(pairs, resumes, strict=True):
                theirs.sendall(resume)
            async with trio.open_nursery() as readers:
                for n, (_, theirs) in enumerate(pairs):
                    readers.start_soon(read, n, theirs)
            profile.disable()
            nursery.cancel_scope.cancel()

    trio.run(herd)
    pstats.Stats(profile).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
