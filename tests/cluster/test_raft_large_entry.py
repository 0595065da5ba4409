"""A publish bigger than pysyncobj's AppendEntries batch (64 KiB), through 3 real seeds.

pysyncobj's leader sends such an entry in parts and marks more than one of them
``finish`` when the content is binary (test_raft_follower.py has the parts); before
``FollowerSafeSyncObj`` took an entry only once its parts unpickle, both followers failed
on it forever and no later publish of the cluster was ever committed.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from cluster_fixture import LocalCluster

from cluster.raft import DIGEST_PERIOD

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from rawclient import RawClient

from migratory.model.message import Message
from migratory.protocol import ops

SUBJECT = "/Raft/Large/Binary"


def test_a_large_binary_publish_commits_on_every_seed(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=3)
    cluster.start_all()
    try:
        cluster.wait_ready()
        client = RawClient(cluster.port(0), timeout=15)
        client.connect("large")
        content = os.urandom(100_000)  # under MaxMessageSize (128 KiB)
        big = client.publish(Message(SUBJECT, content, retained=True, closure="big"))
        assert big.status is ops.Status.PUBLISH_OK, big
        after = client.publish(Message(SUBJECT, b"after", closure="after"))
        assert after.status is ops.Status.PUBLISH_OK, after
        client.close()
        deadline = time.monotonic() + 15
        for i in range(3):  # every seed applies the large entry (404 until it has)
            url = f"{cluster.http(i)}/snapshot?subject={SUBJECT}"
            while True:
                try:
                    with urllib.request.urlopen(url, timeout=5) as reply:
                        assert reply.read() == content
                        break
                except urllib.error.HTTPError as exc:
                    assert exc.code == 404 and time.monotonic() < deadline, (i, exc)
                    time.sleep(0.2)
        time.sleep(DIGEST_PERIOD + 0.2)  # digests computed after those applies
        while time.monotonic() < deadline:  # and every seed agrees on the numbering
            digests = {cluster.status(i).get("coordinator_digest") for i in range(3)}
            if len(digests) == 1:
                break
            time.sleep(0.2)
        assert len(digests) == 1, digests
        for i in range(3):
            assert "Traceback" not in cluster.log(i), cluster.log(i)[-3000:]
    finally:
        cluster.stop()
