"""The client ports a Workers supervisor holds for its workers (cluster/workers.py,
``hold_ports``): each address checked as a single server would bind it."""

from __future__ import annotations

import dataclasses
import socket
import sys

import pytest

from cluster.tooling import free_base_port
from cluster.workers import hold_ports
from migratory.config import load_config

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="SO_REUSEPORT is Linux")


def test_listeners_of_the_server_that_overlap_are_refused_as_a_single_server_refuses_them(
) -> None:
    """Two of the server's own listeners on one address. The configuration refuses the
    same address under two keys, but not ``0.0.0.0:P`` beside ``127.0.0.1:P``, which a
    single server refuses when it listens ("cannot listen on 127.0.0.1:P (ListenMqtt):
    Address already in use"). The workers bound both (SO_REUSEPORT), and every
    connection to 127.0.0.1:P went to the MQTT-only listener. Here the same address
    twice (the configuration's check bypassed), to stay on 127.0.0.1: the check is the
    kernel's either way -- a probe still listening on the first address."""
    port = free_base_port(1)
    config = load_config(overrides={"Listen": f"127.0.0.1:{port}", "Workers": "2"}, environ={})
    config = dataclasses.replace(config, listen_mqtt=(("127.0.0.1", port),))
    with pytest.raises(OSError) as refused:
        hold_ports(config)
    assert refused.value.strerror == (f"cannot listen on 127.0.0.1:{port} (ListenMqtt): "
                                      "Address already in use")
    with socket.socket() as after:  # nothing left bound or listening
        after.bind(("127.0.0.1", port))
        after.listen(1)


def test_distinct_addresses_and_port_0_are_held_and_nothing_listens() -> None:
    port = free_base_port(1)
    config = load_config(overrides={
        "Listen": f"127.0.0.1:{port}, 127.0.0.2:{port}", "ListenMqtt": "127.0.0.1:0",
        "Workers": "2"}, environ={})
    held, overrides = hold_ports(config)
    try:
        assert len(held) == 3
        mqtt_port = held[2].getsockname()[1]
        assert overrides == {"ListenMqtt": f"127.0.0.1:{mqtt_port}"}
        for sock in held:  # bound, never listening: no connection is taken here
            with socket.socket() as client:
                assert client.connect_ex(sock.getsockname()) != 0
    finally:
        for sock in held:
            sock.close()
