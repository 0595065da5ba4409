"""A resume on a member that is behind the committed stream, with real member processes:
it must wait for the member to catch up and then answer DATA_SYNC -- never DATA_RESYNC,
which tells the application it may have missed messages (its state to be rebuilt from the
snapshot) when it missed none.

The member is non-seed 3, its upstream seed's replies held on the way back to it (the
seeds bind behind gates, ``gated_seeds.behind_gates``): for about a
second it is still ready (it last heard from its seed within ``UPSTREAM_SILENCE / 2``)
while the cluster commits a message it has not applied, of a subject it has never
numbered -- what a member restarted or just added holds of every subject until its stream
reaches it. A client resumes there from that message's position. Before, the member
answered ``SUBSCRIBE_ALLOW`` and ``DATA_RESYNC`` at once (``Hub._unplaced``: "this member
lags or forgot it"), then ``DATA_SYNC`` once caught up: a resync for nothing. A member
that never forgot a subject can only be lagging; it now waits in silence, as it already
did for a subject it numbered (same epoch, lower seq).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_fixture import LocalCluster
from cluster_load import Closed, _Link
from gated_seeds import seed_index, started_behind_gates
from tcp_gate import TcpGate

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops

NON_SEED = 3
ATTEMPTS = 5
"""Rounds tried until the member takes the resume while still ready (a loaded box may be
too slow to publish and resume within the second it stays ready)."""


@pytest.fixture
def gated_cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, dict[int, list[TcpGate]]]]:
    cluster = LocalCluster(tmp_path, members=4, seeds=3)
    with started_behind_gates(cluster) as gates:
        yield cluster, gates


def published(link: _Link, subject: str, content: bytes, timeout: float = 10.0) -> Position:
    """Publish ``content`` on ``subject`` and wait for its PUBLISH_OK: its position."""
    closure = content.decode()
    link.send_ops([ops.Publish(Message(subject, content, closure=closure))])
    waited = 0.0
    while waited < timeout:
        for op in link.server_ops(0.1):
            if isinstance(op, ops.PublishStatus) and op.closure == closure:
                assert op.status is ops.Status.PUBLISH_OK and op.position is not None, op
                return op.position
        waited += 0.1
    raise TimeoutError(f"no answer to {closure}")


def statuses(answer: list[ops.ServerOp]) -> list[ops.Status]:
    return [op.status for op in answer if isinstance(op, ops.SubjectStatus)]


def read_until(link: _Link, wanted: ops.Status, timeout: float) -> list[ops.ServerOp]:
    """What ``link`` receives until ``wanted`` (or ``timeout`` seconds)."""
    out: list[ops.ServerOp] = []
    waited = 0.0
    while waited < timeout and wanted not in statuses(out):
        out += link.server_ops(0.1)
        waited += 0.1
    return out


def resume_while_behind(
    cluster: LocalCluster, gate: TcpGate, publisher: _Link, attempt: int
) -> tuple[_Link, list[ops.ServerOp]] | None:
    """Hold the upstream seed's replies, commit a message of a new subject, resume it on
    the non-seed from that message, and let the replies go once it answered (it answers
    while behind, then); the link and that answer, or None when the member was no longer
    ready (it closed the link: 1013) or did not answer in time."""
    subject = f"/lagging/resume/s{attempt}"
    gate.hold_back()
    try:
        position = published(publisher, subject, f"first-{attempt}".encode())
        resumer = _Link(cluster.port(NON_SEED), f"resumer-{attempt}")
        resumer.send_ops([ops.Subscribe((ops.SubscriptionRequest(subject, position),))])
        try:
            answer = read_until(resumer, ops.Status.SUBSCRIBE_ALLOW, 5.0)
            answer += resumer.server_ops(0.1)  # what comes with it
        except Closed:
            resumer.close()
            return None
        if ops.Status.SUBSCRIBE_ALLOW not in statuses(answer):
            resumer.close()
            return None
    finally:
        gate.release(settle=0.0)
    return resumer, answer


@pytest.mark.slow
def test_a_resume_on_a_member_behind_waits_without_a_resync(
    gated_cluster: tuple[LocalCluster, dict[int, list[TcpGate]]],
) -> None:
    cluster, gates = gated_cluster
    upstream = seed_index(cluster, cluster.status(NON_SEED)["replicating_from"])
    assert upstream is not None
    publisher = _Link(cluster.port((upstream + 1) % 3), "publisher")
    try:
        for attempt in range(ATTEMPTS):
            cluster.wait_ready([NON_SEED], timeout=20)
            taken = resume_while_behind(cluster, gates[upstream][0], publisher, attempt)
            if taken is not None:
                break
        else:
            raise AssertionError(f"the non-seed took no resume while ready in {ATTEMPTS} tries")
        resumer, answer = taken
        try:
            later = read_until(resumer, ops.Status.DATA_SYNC, 10.0)  # once it caught up
            # was: SUBSCRIBE_ALLOW, DATA_RESYNC (at once), DATA_SYNC
            assert statuses(answer + later) == [
                ops.Status.SUBSCRIBE_ALLOW, ops.Status.DATA_SYNC], answer + later
        finally:
            resumer.close()
    finally:
        publisher.close()
