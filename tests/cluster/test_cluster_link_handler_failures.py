"""Issue 8: any exception in one cluster link ends that link -- logged with the peer's
name -- never the member, which keeps serving its clients.

A failure (``RuntimeError``) is injected into each link handler, once, mid-run:

- Guaranteed mode, real processes (``faulty_member.py``): ``PeerService._on_op`` on
  the seeds, ``UpstreamReplication._on_op`` and ``forward_to`` on the non-seed, under
  load. Every guarantee still holds for the subscribers.
- Standard mode, real processes: the forwarding side (``LinkChannel.send`` in
  ``_forward_to``) and the serving side (``Hub.publish`` under ``_serve_peer``).
- ``SeedCoordination._sync_from``, in process: a seed with a gap in its stream copies a
  peer's caches; a failure there used to escape into the seed's nursery and end the
  member.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio
from cluster_fixture import LocalCluster
from cluster_load import LoadPublisher, LoadSubscriber, delivery_problems

from cluster.coordination import Coordinator, PublishRequest
from cluster.node import GuaranteedNode
from cluster.tooling import free_base_port, member_settings
from migratory.config import load_config
from migratory.model.message import Message

MEMBER = re.compile(r"127\.0\.0\.1:\d+")


def failure_headers(log: str, name: str) -> list[str]:
    """For each injected failure in ``name``: the log line that reported it (the
    traceback's header, or the line carrying the failure's message)."""
    lines = log.splitlines()
    headers = []
    for i, line in enumerate(lines):
        if f"injected failure in {name}" not in line:
            continue
        if re.match(r"\d{4}-\d\d-\d\d ", line):
            headers.append(line)  # logged on one line
            continue
        header = next((h for h in reversed(lines[:i]) if re.match(r"\d{4}-\d\d-\d\d ", h)), "")
        headers.append(header)
    return headers


def assert_logged_with_a_peer(cluster: LocalCluster, index: int, name: str) -> list[str]:
    headers = failure_headers(cluster.log(index), name)
    assert headers, f"no injected failure in {name} on member {index}"
    members = {s["ClusterMemberListen"] for s in cluster.settings}
    for header in headers:
        named = set(MEMBER.findall(header))
        assert named & members, header
    return headers


@pytest.mark.slow
def test_a_failure_in_any_guaranteed_link_handler_ends_only_that_link(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=4, seeds=3)
    for seed in range(3):
        cluster.faults[seed] = "cluster.peers:PeerService._on_op@3"
    cluster.faults[3] = (
        "cluster.upstream:forward_to@1, cluster.upstream:UpstreamReplication._on_op@200"
    )
    cluster.start_all()
    try:
        cluster.wait_ready(timeout=40)
        subscribers = [LoadSubscriber([cluster.port(i)], tag=f"sub{i}") for i in (0, 3)]
        for subscriber in subscribers:
            subscriber.start()
            subscriber.wait_subscribed(10)
        publisher = LoadPublisher([cluster.port(3)], rate=500, duration=30)
        publisher.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            fired = [
                failure_headers(cluster.log(3), "UpstreamReplication._on_op"),
                *(failure_headers(cluster.log(i), "PeerService._on_op") for i in range(3)),
            ]
            if all(fired):
                break
            time.sleep(0.2)
        fired_after = 20 - (deadline - time.monotonic())
        time.sleep(2)  # and publishing goes on
        publisher.stop()

        assert cluster.exited() == {}
        cluster.wait_ready(timeout=20)
        headers = {
            "forward_to": assert_logged_with_a_peer(cluster, 3, "forward_to"),
            "UpstreamReplication._on_op": assert_logged_with_a_peer(
                cluster, 3, "UpstreamReplication._on_op"
            ),
        }
        for i in range(3):
            headers[f"PeerService._on_op on {i}"] = assert_logged_with_a_peer(
                cluster, i, "PeerService._on_op"
            )
        late = list(publisher.sent)[-500:]  # after every failure: the member still serves
        assert all(closure in publisher.acked for closure in late), publisher.summary()
        acked = publisher.acked_messages()
        for subscriber in subscribers:
            subscriber.wait_for({c for m in acked.values() for c, _ in m}, 20)
            subscriber.stop()
            assert delivery_problems(subscriber.messages(), acked) == []
        print("; ".join(f"{k}: {v[0][24:]}" for k, v in headers.items()))
        print(f"all fired after {fired_after:.1f} s; {publisher.summary()}")
    finally:
        cluster.stop()


@pytest.mark.slow
def test_a_failure_in_a_standard_link_handler_ends_only_that_link(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=3, mode="Standard")
    cluster.faults[0] = "cluster.link_io:LinkChannel.send@200"  # forwarding to a peer
    cluster.faults[2] = "migratory.server.hub:Hub.publish@300"  # serving a peer's link
    cluster.start_all()
    try:
        cluster.wait_ready(timeout=30)
        subscribers = [LoadSubscriber([cluster.port(i)], tag=f"sub{i}") for i in (1, 2)]
        for subscriber in subscribers:
            subscriber.start()
            subscriber.wait_subscribed(10)
        publisher = LoadPublisher([cluster.port(0)], rate=300, duration=30)
        publisher.start()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not (
            failure_headers(cluster.log(0), "LinkChannel.send")
            and failure_headers(cluster.log(2), "Hub.publish")
        ):
            time.sleep(0.2)
        fired_at = time.monotonic()
        time.sleep(2)
        publisher.stop()
        assert cluster.exited() == {}
        forwarding = assert_logged_with_a_peer(cluster, 0, "LinkChannel.send")
        serving = assert_logged_with_a_peer(cluster, 2, "Hub.publish")
        assert "interrupted" in forwarding[0] and "failed; closing it" in serving[0]
        # published after both failures: delivered everywhere (the links came back)
        late = {
            content
            for closure, (_, content) in publisher.sent.items()
            if closure in publisher.acked and int(closure[1:]) >= len(publisher.sent) - 200
        }
        assert len(late) >= 150
        for subscriber in subscribers:
            subscriber.wait_for(late, 15)
            subscriber.stop()
        print(f"{forwarding[0][24:]}; {serving[0][24:]}; {time.monotonic() - fired_at:.1f} s")
    finally:
        cluster.stop()


def seed_config(tmp_path: Path) -> Any:
    settings = member_settings(
        0, members=4, seeds=3, mode="Guaranteed", base_port=free_base_port(4),
        password="in-process", data_dir=tmp_path / "data",
    )
    return load_config(overrides=settings, environ={})


def test_a_failure_while_copying_a_peer_seeds_caches_ends_only_that_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    attempts: list[str] = []

    async def failing_sync_from(self: Any, address: tuple[str, int]) -> None:
        attempts.append(f"{address[0]}:{address[1]}")
        raise RuntimeError("injected failure in SeedCoordination._sync_from")

    monkeypatch.setattr("cluster.seed.SeedCoordination._sync_from", failing_sync_from)
    monkeypatch.setattr("cluster.seed.RETRY_SECONDS", 0.05)
    # a lone seed starts Raft only once a peer seed has compared settings with it (the
    # agreement probe): none runs here
    monkeypatch.setattr("cluster.agreement.SeedAgreement.settled",
                        lambda self, majority: True)
    node = GuaranteedNode(seed_config(tmp_path))
    coordinator = Coordinator()
    batches = [
        coordinator.apply_batch(5, [PublishRequest("x", i, Message("/a/b", b"m"))])
        for i in range(2)
    ]
    status: dict[str, Any] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.server.serve)
            await nursery.start(node.run)
            assert node.seed is not None
            with trio.fail_after(5):  # the role starts once the agreement has settled
                while node.seed._nursery is None:
                    await trio.sleep(0.01)
            node.seed._committed(batches[1])  # batch 1 never came: a gap
            with trio.fail_after(10):
                while len(attempts) < 4:
                    await trio.sleep(0.05)
            host, port = node.server.addresses[0]
            url = f"http://{host}:{port}/cluster"
            status.update(await trio.to_thread.run_sync(fetch_json, url))
            nursery.cancel_scope.cancel()

    trio.run(main)
    peers = {f"127.0.0.1:{p}" for p in (node.config.seed_members[1][1],
                                           node.config.seed_members[2][1])}
    assert set(attempts) == peers  # it went on trying every peer seed
    logged = [r.getMessage() for r in caplog.records if "cache sync from" in r.getMessage()]
    assert logged and all(any(p in m for p in peers) for m in logged), logged
    assert status["not_ready_reason"] == "member is syncing its cache"  # and still answers


def fetch_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as reply:
        result: dict[str, Any] = json.loads(reply.read())
        return result
