"""A Custom entitlement plugin that never answers, in a live server: the client it
blocks is denied (SUBSCRIBE_DENY), later uncached decisions are denied at once, and a
subscriber whose rights were decided before keeps receiving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rawclient import RawClient

from migratory.model.message import Message
from migratory.protocol import ops

STUCK_PLUGIN = '''
import time

class Rules:
    def __init__(self, options):
        pass

    def allow_connect(self, client):
        return True

    def allow_subscribe(self, client, subject):
        if subject.startswith("/Stuck/"):
            time.sleep(60)  # a rules service that never answers
        return True

    def allow_publish(self, client, subject):
        return True
'''


def test_a_stuck_plugin_denies_and_the_other_clients_carry_on(
    start_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "stuck_rules.py").write_text(STUCK_PLUGIN)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    server = start_server(BatchTime="0", Entitlement="Custom",
                          EntitlementPlugin="stuck_rules:Rules", EntitlementPluginTimeout="100")
    reader, publisher, victim = (RawClient(server.port) for _ in range(3))
    reader.connect("reader")
    reader.subscribe("/a/b")
    reader.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW)
    publisher.connect("publisher")
    first = publisher.publish(Message("/a/b", b"0", closure="0"))  # decided, cached
    assert first.status is ops.Status.PUBLISH_OK
    victim.connect("victim")
    victim.subscribe("/Stuck/x")
    denied = victim.recv_ops_until_status(ops.Status.SUBSCRIBE_DENY)[-1]
    victim.subscribe("/a/c")  # asked while the plugin is stuck: denied at once
    denied_too = victim.recv_ops_until_status(ops.Status.SUBSCRIBE_DENY)[-1]
    assert isinstance(denied, ops.SubjectStatus) and denied.subject == "/Stuck/x"
    assert isinstance(denied_too, ops.SubjectStatus) and denied_too.subject == "/a/c"
    for i in range(1, 21):
        assert publisher.publish(Message("/a/b", b"%d" % i, closure=str(i))).status is (
            ops.Status.PUBLISH_OK)
    got = [m.content for m in reader.recv_messages(21)]
    assert got == [b"%d" % i for i in range(21)]
    for client in (reader, publisher, victim):
        client.close()
    assert "stuck_rules:Rules" in server.log() and "EntitlementPluginTimeout" in server.log()
