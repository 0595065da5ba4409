"""What ``serve`` builds from the configuration: a server alone, a Guaranteed member
(:mod:`cluster.node`) or a Standard member (:mod:`cluster.standard`).

Each kind's modules are imported only when the configuration asks for that kind: a
server alone imports none of the cluster's (Raft, pysyncobj, the links: about a fifth
of the instructions of its start-up imports), a Standard member none of the Guaranteed
member's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from migratory.server.app import Role, Server

if TYPE_CHECKING:
    from migratory.config import Config


def build_node(config: Config) -> tuple[Server, list[Role]]:
    """The server ``config`` describes and the roles to run beside it."""
    if not config.clustered:
        return Server(config), []
    if config.cluster_delivery_mode == "Guaranteed":
        from cluster.node import GuaranteedNode

        node = GuaranteedNode(config)
        return node.server, [node]
    from cluster.standard import StandardNode

    standard = StandardNode(config)
    return standard.server, [standard]
