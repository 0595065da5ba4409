"""A herd of catch-ups from different positions on the other front ends (issue 13, "no
stalls"): ``benchmarks/resume_herd_spread.py`` is the native WebSocket resume; here
``--front`` picks

- ``sse``: Server-Sent Events streams reconnecting with a ``Last-Event-ID`` that names
  each subject's own position (drawn between 1 and ``--back`` messages back), counted
  until each has its ``per-client`` ``sync`` events;
- ``mqtt``: persistent MQTT sessions (clean session 0) reconnecting, each recorded at
  its own position: the clients subscribe in ``--back`` groups while the last ``--back``
  messages of every subject are published, one group after each message (the first
  group misses ``--back`` - 1, the last none), and disconnect; at the signal each
  sends CONNECT and PINGREQ, counted until its PINGRESP (handled after the catch-up);
- ``history``: native clients subscribing without a position, each subject with a
  history of 1 to ``--back`` messages, then a ping, counted until the pong.

The rest is resume_herd_spread's: one server on 127.0.0.1, ``--procs`` client processes
connecting ``--clients`` connections, one signal; reported: the time until every client
had what it waits for, the server's CPU meanwhile, its longest event-loop gap in that
window (``/stats loop_gaps``) and the bystander's largest delay (a native client
publishing to itself every 20 ms)::

    .venv/bin/python benchmarks/resume_herd_fronts.py --front sse --clients 5000

docs/benchmarks.md, "A herd of resumes from different positions".
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys
import urllib.parse
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "server"))
sys.path.insert(0, str(Path(__file__).parent))

from attacks import Server
from mqttclient import MqttRawClient
from rawclient import RawClient
from resume_herd import read_until_synced
from resume_herd_spread import fill, herd_arguments, report, run_herd

from migratory.model.message import Message
from migratory.protocol import mqtt, mqtt_encode, ops
from migratory.protocol import websocket as ws

MARKERS = {"sse": b"event:sync", "mqtt": mqtt_encode.PINGRESP_BYTES, "history": b"dpong"}


def sse_request(rng: random.Random, subjects: list[str], per_client: int, epoch: int,
                cached: int, back: int) -> bytes:
    """A stream of ``per_client`` subjects reconnecting, each from its own position."""
    chosen = rng.sample(subjects, per_client)
    query = "&".join("subject=" + urllib.parse.quote(s, safe="") for s in chosen)
    last = ",".join(f"{epoch}:{cached - rng.randint(1, back)}" for _ in chosen)
    return (f"GET /events?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Last-Event-ID: {last}\r\n\r\n").encode("ascii")


def history_request(rng: random.Random, subjects: list[str], per_client: int,
                    back: int) -> bytes:
    requests = tuple(ops.SubscriptionRequest(s, history=rng.randint(1, back))
                     for s in rng.sample(subjects, per_client))
    return b"".join(ws.encode_masked_binary(ops.encode_client_op(op), b"abcd")
                    for op in (ops.Subscribe(requests), ops.Ping(1)))


def mqtt_request(client_id: str) -> bytes:
    return (mqtt_encode.encode_packet(mqtt.Connect(client_id, clean_session=False,
                                                   keep_alive=0))
            + mqtt_encode.encode_packet(mqtt.Pingreq()))


def mqtt_sessions(port: int, mqtt_port: int, subjects: list[str], clients: int,
                  per_client: int, back: int, rng: random.Random) -> list[bytes]:
    """Record ``clients`` persistent sessions at spread positions (see the module's
    docstring); each one's reconnect (CONNECT, PINGREQ)."""
    publisher = RawClient(port, timeout=120)
    publisher.connect("mqtt-publisher")
    frames = []
    for n in range(clients):
        group = n * back // clients
        if (n and group != (n - 1) * back // clients) or n == 0:
            for subject in subjects:  # one more message on every subject
                publisher.send_op(ops.Publish(Message(subject, b"x" * 100)))
            publisher.send_op(ops.Ping(n))
            while not isinstance(publisher.recv_op(), ops.Pong):
                pass
        client_id = f"herd-{n}"
        client = MqttRawClient(mqtt_port, timeout=60)
        client.connect(client_id, clean_session=False, keep_alive=0)
        client.subscribe(*(s[1:] for s in rng.sample(subjects, per_client)))
        client.send(mqtt.Disconnect())
        client.sock.close()
        frames.append(mqtt_request(client_id))
    publisher.close()
    return frames


def swarm(port: int, frames: list[bytes], per_client: int, marker: bytes, native: bool,
          pipe: Connection) -> None:
    """One client process: open every connection, say so, wait for the signal, send every
    request, count each connection's markers; send back when the last had them all."""
    clients = []
    for i, _ in enumerate(frames):
        if native:
            client = RawClient(port, timeout=120)
            client.connect(f"h{os.getpid()}-{i}")
            clients.append(client.sock)
        else:
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=120))
    pipe.send("connected")
    pipe.recv()  # go
    for sock, frame in zip(clients, frames, strict=True):
        sock.sendall(frame)
    synced, closed, received, last = read_until_synced(clients, 300.0, per_client, marker)
    pipe.send({"synced": synced, "closed": closed, "bytes": received, "last": last})
    for sock in clients:
        sock.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--front", choices=sorted(MARKERS), required=True)
    herd_arguments(parser)  # (--back: also the most history asked)
    args = parser.parse_args()
    settings = dict(s.split("=", 1) for s in args.set)
    mqtt_port = free_port()
    server = Server(MaxConnectionRatePerAddress="0", MaxConnectionsPerAddress="0",
                    MaxPublishesPerSecond="0", MaxHandshakesPerAddress="0",
                    HandshakeTimeout="600", MaxPendingHandshakes="100000",
                    ListenMqtt=f"127.0.0.1:{mqtt_port}",
                    MaxCachedMessagesPerSubject=str(args.cached), **settings)
    try:
        subjects = [f"/Spread/s{i}" for i in range(args.subjects)]
        rng = random.Random(args.seed)
        port = server.port
        if args.front == "mqtt":
            fill(server, subjects, args.cached - args.back)
            frames = mqtt_sessions(port, mqtt_port, subjects, args.clients, args.per_client,
                                   args.back, rng)
            port = mqtt_port
        else:
            epoch = fill(server, subjects, args.cached)
            frames = [sse_request(rng, subjects, args.per_client, epoch, args.cached, args.back)
                      if args.front == "sse" else
                      history_request(rng, subjects, args.per_client, args.back)
                      for _ in range(args.clients)]
        per_client = args.per_client if args.front == "sse" else 1
        figures = run_herd(server, swarm, [
            (port, frames[p::args.procs], per_client, MARKERS[args.front],
             args.front == "history") for p in range(args.procs)])
        report(args, figures, front=args.front)
    finally:
        server.stop()


if __name__ == "__main__":
    socket.setdefaulttimeout(None)
    main()
