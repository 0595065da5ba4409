"""A member that goes silent without closing (SIGSTOP: a frozen VM, a lost node) under an
SDK subscriber, with ~110 publishes/s through another member on one subject and the
default cache (MaxCachedMessagesPerSubject = 1000: about 9 s of that subject).

The subscriber must see the silence soon enough to resume on another member while the
cache still reaches back to its position: DATA_SYNC, every acknowledged message once,
in order. Before the heartbeats (docs/protocol.md, "Heartbeats") the SDKs noticed only
when a ping went unanswered -- 15 + 10 s by default, ~2,750 messages -- and resumed with
DATA_RESYNC, the messages in between lost to them although the cluster kept them all.
The Python SDK, then the JavaScript SDK (node's WebSocket, as in a browser)."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from cluster_fixture import LocalCluster
from cluster_load import LoadPublisher

from migratory.model.message import Message
from migratory_client import Notification, NotificationStatus, ReconnectPolicy, connect

SUBJECT = "/frozen/s"
RATE = 110.0
PUBLISHING = 11.0  # seconds: the freeze comes after ~2 s, the resume 4-5 s later
FAST = ReconnectPolicy(initial_delay=0.05, max_delay=0.2, connect_timeout=3.0)
FROZEN, PUBLISHED_ON, OTHER = 3, 0, 1
"""The subscriber's member (a non-seed: Raft goes on), the publisher's, the one left."""
FREEZE_AFTER = 200  # messages received
JS_DIR = Path(__file__).resolve().parents[2] / "clients" / "js"
JS_SUBSCRIBER = JS_DIR / "test" / "support" / "subscriber.mjs"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path, members=4, seeds=3)
    cluster.start_all()
    try:
        cluster.wait_ready()
        yield cluster
    finally:
        process = cluster.processes[FROZEN]
        if process is not None:
            process.send_signal(signal.SIGCONT)  # (stopped: it would not see its SIGTERM)
        cluster.stop()


def servers(cluster: LocalCluster) -> list[str]:
    """The frozen member first; weight 0: the other only once that one failed."""
    return [f"100 {cluster.url(FROZEN)}", f"0 {cluster.url(OTHER)}"]


class Freezer:
    """Freezes the subscriber's member once it received ``FREEZE_AFTER`` messages."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.at: float | None = None

    def received(self, count: int) -> None:
        if self.at is None and count >= FREEZE_AFTER:
            self.at = time.monotonic()
            process = self.cluster.processes[FROZEN]
            assert process is not None
            process.send_signal(signal.SIGSTOP)


def publishing(cluster: LocalCluster) -> LoadPublisher:
    return LoadPublisher([cluster.port(PUBLISHED_ON)], rate=RATE, duration=PUBLISHING,
                         subjects=[SUBJECT])


def receive_all(
    publisher: LoadPublisher, count: Callable[[], int], wait: Callable[[], Any]
) -> None:
    """Until every acknowledged message came, or none for 5 s once the publisher is done
    (after a DATA_RESYNC the ones it lost never come); ``wait`` waits a little."""
    heard, last = time.monotonic(), 0
    deadline = time.monotonic() + 60  # a hang guard
    while publisher.is_alive() or (
        count() < len(publisher.acked) and time.monotonic() < heard + 5
    ):
        assert time.monotonic() < deadline, "the subscriber hung"
        wait()
        if count() != last:
            heard, last = time.monotonic(), count()


def check(publisher: LoadPublisher, freezer: Freezer, downs: list[str | None], statuses: list[str],
          contents: list[bytes], seqs: list[int]) -> None:
    print("notifications", statuses, downs)
    print(publisher.summary(), "received", len(contents))
    assert freezer.at is not None, "the subscriber never got going"
    assert downs and "nothing from the server" in (downs[0] or ""), downs
    assert "DATA_SYNC" in statuses
    assert "DATA_RESYNC" not in statuses
    assert seqs == sorted(set(seqs)), "a duplicate or a reordering reached the application"
    acked = [content for content, _ in publisher.acked_messages()[SUBJECT]]
    assert contents == acked, "an acknowledged message is missing"


def test_sdk_subscriber_of_a_frozen_member_resumes_elsewhere_with_data_sync(
    cluster: LocalCluster,
) -> None:
    notes: list[Notification] = []
    received: list[Message] = []
    freezer, publisher = Freezer(cluster), publishing(cluster)

    async def main() -> None:
        async with (
            connect(servers(cluster), reconnect=FAST, rng=random.Random(7)) as client,
            client.subscribe(SUBJECT) as subscription,
            trio.open_nursery() as nursery,
        ):

            async def watch() -> None:
                async for note in client.notifications():
                    notes.append(note)

            async def read() -> None:
                async for message in subscription:
                    received.append(message)
                    freezer.received(len(received))

            nursery.start_soon(watch)
            assert await client.wait_connected() == cluster.url(FROZEN)
            await trio.sleep(0.3)  # subscribed
            nursery.start_soon(read)
            publisher.start()
            await trio.to_thread.run_sync(
                receive_all, publisher, lambda: len(received), lambda: time.sleep(0.2))
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        if publisher.ident is not None:
            publisher.stop()
    downs = [n.reason for n in notes if n.status is NotificationStatus.SERVER_DOWN]
    check(publisher, freezer, downs, [n.status.name for n in notes],
          [m.content for m in received], [m.seq for m in received])


def test_js_subscriber_of_a_frozen_member_resumes_elsewhere_with_data_sync(
    cluster: LocalCluster,
) -> None:
    node = shutil.which("node")
    if node is None or not (JS_DIR / "node_modules" / "cbor-x").is_dir() or not (
        JS_DIR / "src" / "close_codes.generated.js"
    ).is_file():
        pytest.fail("needs node >= 20 and clients/js built: make js (npm ci in clients/js)")
    records: list[dict[str, Any]] = []
    freezer, publisher = Freezer(cluster), publishing(cluster)
    subscriber = subprocess.Popen(
        [node, "--experimental-websocket", str(JS_SUBSCRIBER), SUBJECT, *servers(cluster)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )

    def read() -> None:
        assert subscriber.stdout is not None
        count = 0
        for line in subscriber.stdout:
            record = json.loads(line)
            records.append(record)
            if "message" in record:
                count += 1
                freezer.received(count)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def messages() -> list[dict[str, Any]]:
        return [r for r in list(records) if "message" in r]

    try:
        deadline = time.monotonic() + 20  # a hang guard
        while not any(r.get("note") == "SUBSCRIBE_ALLOW" for r in list(records)):
            assert time.monotonic() < deadline and subscriber.poll() is None, records
            time.sleep(0.05)
        assert records[0]["server"] == cluster.url(FROZEN)
        publisher.start()
        receive_all(publisher, lambda: len(messages()), lambda: time.sleep(0.2))
    finally:
        if publisher.ident is not None:
            publisher.stop()
        assert subscriber.stdin is not None
        subscriber.stdin.close()
        try:
            subscriber.wait(10)
        finally:
            if subscriber.poll() is None:
                subscriber.kill()
                subscriber.wait()
        reader.join(5)
    notes = [r for r in records if "note" in r]
    got = messages()
    check(publisher, freezer, [r["reason"] for r in notes if r["note"] == "SERVER_DOWN"],
          [r["note"] for r in notes], [r["message"].encode() for r in got], [r["seq"] for r in got])
