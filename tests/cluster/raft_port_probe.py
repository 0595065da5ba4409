"""What reaches pysyncobj on a Raft port: every ``TcpConnection`` built for an accepted
socket (by pysyncobj's ``TcpServer`` or by the front)."""

from __future__ import annotations

from typing import Any

import pytest
from pysyncobj.tcp_connection import TcpConnection


def count_incoming(monkeypatch: pytest.MonkeyPatch) -> list[TcpConnection]:
    """Every TcpConnection built for an accepted socket from now to the test's end."""
    built: list[TcpConnection] = []
    real = TcpConnection.__init__

    def counting(self: TcpConnection, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        if kwargs.get("socket") is not None:
            built.append(self)  # list.append: safe from pysyncobj's tick threads

    monkeypatch.setattr(TcpConnection, "__init__", counting)
    return built
