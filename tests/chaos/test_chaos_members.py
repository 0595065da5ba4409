"""The ports a chaos run picks: every port a member or a proxy will bind is free
(chaos/members.py ``ports_bound``, ``on_free_ports``), not only the ones of the base
port's formula (cluster/tooling.py): the MQTT listener (client port + 5) and its
proxy were not looked at, nor a listener given with ``--set``."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from chaos.members import MQTT_OFFSET, build_members, on_free_ports, ports_bound
from cluster.tooling import free_base_port


def test_every_port_a_member_or_proxy_binds_is_named(tmp_path: Path) -> None:
    members, proxy_of, _ = build_members(count=3, seeds=3, base=20_000, proxies=True,
                                         out=tmp_path, env={}, on_crash=lambda m, s: None,
                                         mqtt=True)
    members[0].settings["MonitorListen"] = "127.0.0.1:29000"
    ports = ports_bound(members, proxy_of)
    for i in range(3):
        client = 20_000 + 10 * i
        assert {client, client + MQTT_OFFSET, client + 2000, client + 2001,  # binds
                client + 1000, client + 1001, client + 3000,  # proxies
                client + 3000 + MQTT_OFFSET} <= set(ports)
    assert 29_000 in ports
    assert len(ports) == len(set(ports)) == 3 * 8 + 1


def test_a_base_whose_mqtt_port_is_taken_is_not_picked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The base port's formula leaves client port + 5 out: a run with MQTT subscribers
    started a member on a port another process held ("Address already in use")."""
    import chaos.members
    import chaos.runner

    taken = free_base_port(5)
    # another base whose ports (base .. base + 40 + 3005) stay clear of the held one
    free = next(b for b in (free_base_port(5) for _ in range(1000)) if abs(b - taken) > 4000)
    bases = iter([taken, free])
    monkeypatch.setattr(chaos.members, "free_base_port", lambda members, rng=None: next(bases))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken + MQTT_OFFSET))  # member 0's MQTT port
        holder.listen()
        runner = chaos.runner.Runner(seed=1, duration=5, out=tmp_path / "r",
                                     mqtt_subscribers=1)
        try:
            assert runner.base == free
            assert runner.members[0].settings["ListenMqtt"] == f"127.0.0.1:{free + MQTT_OFFSET}"
        finally:
            runner.h.close()


def test_a_port_two_members_would_bind_ends_the_command(tmp_path: Path) -> None:
    def build(base: int) -> Any:
        return build_members(count=3, seeds=3, base=base, proxies=True, out=tmp_path,
                             env={}, on_crash=lambda m, s: None)

    with pytest.raises(SystemExit, match="port 29100 would be bound by two"):
        on_free_ports(lambda: free_base_port(3), build, {},
                      {"MonitorListen": "127.0.0.1:29100"})
