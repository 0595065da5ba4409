"""migratory/server/run.py: a role that leaves (``LeavingRole``, a Standard member's
goodbyes) is asked to once a SIGTERM's drain is over and the server stopped -- not after
a SIGINT, which stops at once."""

from __future__ import annotations

import os
import signal

import pytest
import trio

from migratory.config import Config
from migratory.server.app import Server
from migratory.server.run import run_until_signalled


class Leaving:
    def __init__(self, server: Server, sig: signal.Signals) -> None:
        self.server, self.sig = server, sig
        self.left_after: list[bool] = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                  ) -> None:
        task_status.started()
        await trio.sleep(0.05)  # (the receiver of the signals is listening by then)
        os.kill(os.getpid(), self.sig)
        await trio.sleep_forever()

    async def leave(self) -> None:
        self.left_after.append(self.server.nursery.cancel_scope.cancel_called)


@pytest.mark.parametrize(("sig", "left"), [(signal.SIGTERM, [True]), (signal.SIGINT, [])],
                         ids=["SIGTERM", "SIGINT"])
def test_a_role_leaves_after_a_sigterms_drain_once_the_server_stopped(
    sig: signal.Signals, left: list[bool],
) -> None:
    server = Server(Config.from_mapping({"Listen": "127.0.0.1:0"}))
    role = Leaving(server, sig)
    trio.run(lambda: run_until_signalled(server, roles=[role], ready_line=False))
    assert role.left_after == left
