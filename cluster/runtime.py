"""Attach the configured cluster role to a running server."""

from __future__ import annotations

import trio

from migratory.config import Config
from migratory.server.app import Server


async def start_member(config: Config, server: Server, nursery: trio.Nursery) -> None:
    if config.cluster_delivery_mode == "Guaranteed":
        from cluster.member import GuaranteedMember

        await nursery.start(GuaranteedMember(config, server).run)
    else:
        from cluster.standard import StandardMember

        await nursery.start(StandardMember(config, server).run)
