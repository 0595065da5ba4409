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

import random

from cluster.tooling import ephemeral_low
from cluster.up_checks import port_free


def listen_port(span: int = 1) -> int:
    """A free port on 127.0.0.1 below the ephemeral range (10000 up to it), and the
    ``span - 1`` ports after it free too."""
    top = max(ephemeral_low() - span, 10_001)
    for _ in range(200):
        port = random.randrange(10_000, top)
        if all(port_free(port + i) for i in range(span)):
            return port
    raise RuntimeError("no free port below the ephemeral range")


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
