"""The garbage bystander of the chaos runner (chaos/garbage.py, ``--garbage N``): its
inputs, the ports it feeds, the option, and one live server fed every input at once --
alive afterwards, a subscriber of the ``/chaos`` subjects given nothing of it, the
protocol violations that must end a connection ended."""

from __future__ import annotations

import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio

from chaos.garbage import Input, _feed, draw, feeder, garbage_ports, inputs
from chaos.members import build_members
from chaos.rawtrio import RawSession
from cluster.tooling import MQTT_OFFSET
from migratory.protocol import ops

SUBJECTS = [f"/chaos/s{i}" for i in range(4)]


def test_draws_are_seeded_and_keep_to_the_members_ports() -> None:
    names = [(i.port, i.name) for i in (draw(random.Random(5), ["ws", "mqtt"]) for _ in "ab")]
    again = [(i.port, i.name) for i in (draw(random.Random(5), ["ws", "mqtt"]) for _ in "ab")]
    assert names == again
    rng = random.Random(1)
    drawn = {draw(rng, ["http", "cluster"]).port for _ in range(200)}
    assert drawn == {"http", "cluster"}
    assert all(i.handshake == (i.port == "ws")
               for i in (draw(rng, ["ws", "http"]) for _ in range(50)))


def test_only_invalid_inputs_name_the_workloads_subjects() -> None:
    """A valid publish of the bystander would reach the workload's subscribers: the
    well-formed ones go to /garbage/ subjects (what names /chaos is malformed)."""
    every = inputs(random.Random(2))
    assert set(every) == {"ws", "http", "mqtt", "cluster", "raft"}
    smuggled = dict(every["http"])["smuggled second request"]
    assert b"/garbage/h" in smuggled and b"/chaos" not in smuggled
    # never a workload client's id (m0, m1, ...: a takeover of its session)
    assert not any(re.search(rb"MQTT\x04.\x00\x0a\x00.[^g]", data, re.S)
                   for _, data in every["mqtt"])


def test_the_ports_fed_are_the_ones_clients_and_peers_use(tmp_path: Path) -> None:
    members, _, urls = build_members(count=4, seeds=3, base=20_000, proxies=True,
                                     out=tmp_path, env={}, on_crash=lambda m, s: None,
                                     mqtt=True)
    ports = garbage_ports(urls, members, 3, raft=True)
    for i, p in enumerate(ports):
        client = 20_000 + 3000 + 10 * i
        peer = 20_000 + 1000 + 10 * i
        assert p["ws"] == p["http"] == client and p["mqtt"] == client + MQTT_OFFSET
        assert p["cluster"] == peer and p.get("raft") == (peer + 1 if i < 3 else None)
    assert all("raft" not in p for p in garbage_ports(urls, members, 3, raft=False))


def test_the_option_reaches_the_runner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import chaos.runner
    from chaos import __main__ as cli

    seen: dict[str, Any] = {}
    monkeypatch.setattr(chaos.runner, "run", lambda **kw: seen.update(kw) or 0)
    assert cli.main(["run", "--seed", "1", "--duration", "5", "--out", str(tmp_path / "r"),
                     "--garbage", "2"]) == 0
    assert seen["garbage"] == 2


async def _watch(port: int, got: list[ops.ServerOp], ready: trio.Event) -> None:
    async with await RawSession.open(port, "w") as session:
        await session.subscribe([(s, None) for s in SUBJECTS])
        ready.set()
        async for op in session.ops(ping_every=0.5, pong_timeout=5):
            if isinstance(op, ops.Deliver):
                got.append(op)


def test_a_live_server_fed_every_input_serves_on_and_leaks_nothing(start_server: Any) -> None:
    server = start_server(ListenMqtt="127.0.0.1:0")
    ports = {"ws": server.port, "http": server.port, "mqtt": server.mqtt_port}
    outcomes: dict[tuple[str, str], str] = {}
    delivered: list[ops.ServerOp] = []
    counts: Counter[str] = Counter()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            ready = trio.Event()
            nursery.start_soon(_watch, server.port, delivered, ready)
            await ready.wait()

            async def one(kind: str, name: str, data: bytes) -> None:
                outcomes[kind, name] = await _feed(ports[kind], Input(kind, name, data,
                                                                      kind == "ws"))

            async with trio.open_nursery() as feeding:
                for kind, items in inputs(random.Random(3)).items():
                    for name, data in items if kind in ports else ():
                        feeding.start_soon(one, kind, name, data)
            fed = iter(range(3))  # and the feeder, round two "members", three inputs
            await feeder(random.Random(4), [ports, {"http": server.port}], counts,
                         lambda: next(fed, None) is not None)
            await trio.sleep(0.5)  # what a taken publish would have fanned out
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert server.proc.poll() is None, server.log()
    assert delivered == []  # the workload's subjects got nothing of the garbage
    assert len(outcomes) == sum(len(v) for k, v in inputs(random.Random(3)).items()
                                if k in ports)
    # protocol violations that end the connection (RFC 6455 5.2/5.5, MQTT-3.3.1-4, ...)
    for key in [("ws", "unmasked frame"), ("ws", "reserved opcode"), ("ws", "rsv bit"),
                ("ws", "fragmented ping"), ("ws", "publish before connect"),
                ("mqtt", "publish before connect"), ("mqtt", "publish qos 3"),
                ("mqtt", "remaining length of 5 bytes"), ("mqtt", "protocol name MQTX"),
                ("http", "nul in the request line"), ("http", "length and chunked")]:
        assert outcomes[key].endswith("closed"), (key, outcomes[key])
    assert sum(counts.values()) == 3
    assert {key.split("/")[0] for key in counts} <= {"ws", "http", "mqtt"}
