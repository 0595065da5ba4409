"""A port for a test's listener that no outgoing connection can take meanwhile.

``bind(("127.0.0.1", 0))`` hands out a port from the kernel's ephemeral range -- the
range every outgoing connection's local port comes from -- so between the probe
closing and the code under test binding it, any process's ``connect`` may take that
number. A port below the ephemeral range is only ever taken by a listener that asks
for it. Every test that needs a free port for a listener it does not bind itself
takes it from here (``test_the_first_candidate_is_elected_over_a_kept_alive_link``
failed in CI with "Address already in use" on a port it had found with ``bind(0)``).
(Put in after ``test_a_submit_while_a_dump_loads_still_commits`` failed once in CI
with "the submit never completed"; that was NOT this race: our Raft transport elects
itself even with its port taken, checked with a squatting listener. Its cause is open.)
"""

from __future__ import annotations

import os
import random

from cluster.tooling import PORT_SLICE_ENV, ephemeral_low
from cluster.up_checks import port_free

CLUSTER_PORTS_FROM = 20_000
"""Where the clusters' base ports begin (``cluster.tooling.free_base_port``): a
listener's port is taken below, so that no other xdist worker's cluster takes it between
the probe and the bind (``test_listener_roles_refuse_publishes_and_protocols``: "server
did not start" in the CI of d966028a)."""


def _range(span: int) -> tuple[int, int]:
    """Where this worker's listeners' ports are picked: 10000 up to the clusters' ports,
    cut in the worker's share under ``MIGRATORY_BASE_PORT_SLICE`` (K/N: tests/conftest.py);
    up to the ephemeral range when that begins lower."""
    low, high = 10_000, min(CLUSTER_PORTS_FROM, ephemeral_low())
    index, _, count = os.environ.get(PORT_SLICE_ENV, "").partition("/")
    if index.isdigit() and count.isdigit() and 0 <= int(index) < int(count):
        width = (high - low) // int(count)
        low, high = low + int(index) * width, low + (int(index) + 1) * width
    return low, max(high - span, low + 1)


def listen_port(span: int = 1) -> int:
    """A free port on 127.0.0.1 below the ephemeral range and the clusters' ports (this
    worker's share of 10000-19999), and the ``span - 1`` ports after it free too."""
    low, top = _range(span)
    for _ in range(200):
        port = random.randrange(low, top)
        if all(port_free(port + i) for i in range(span)):
            return port
    raise RuntimeError(f"no free port in {low}-{top}")


def listen_ports(count: int) -> list[int]:
    """``count`` different ports as :func:`listen_port` gives them."""
    ports: list[int] = []
    while len(ports) < count:
        port = listen_port()
        if port not in ports:
            ports.append(port)
    return ports


def seed_port() -> int:
    """A cluster port for a :class:`~cluster.raft.RaftCoordination`: it and its Raft
    port (the next one) free."""
    return listen_port(span=2)
