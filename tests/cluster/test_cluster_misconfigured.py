"""A member started with another ClusterDeliveryMode than the cluster's (one pod of a
rolling config change, one member's file edited): real processes.

Before: the Standard member was ready at once and served its clients alone -- its
publishes refused by the Guaranteed seeds' links, their messages never reaching it
(silently mis-routed). Now it is not ready, /readyz says why naming the key and both
values, the seeds log the refusal, and the two seeds that agree keep serving: a publish
acknowledged on one is on the other.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

from cluster_fixture import LocalCluster


def readyz(cluster: LocalCluster, index: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"{cluster.http(index)}/readyz", timeout=2) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_member_of_another_delivery_mode_is_not_ready_and_the_rest_serves(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path, members=3)
    try:
        # a new cluster elects its first leader with every seed (docs/cluster.md): the
        # odd file comes with a restart, as in a rolling config change
        cluster.start_all()
        cluster.wait_ready()
        cluster.kill(2, signal.SIGTERM)
        cluster.settings[2]["ClusterDeliveryMode"] = "Standard"
        cluster.start(2)
        deadline = time.monotonic() + 10
        status, reason = 0, ""
        while "ClusterDeliveryMode" not in reason and time.monotonic() < deadline:
            time.sleep(0.1)
            try:
                status, reason = readyz(cluster, 2)
            except OSError:  # not listening yet
                continue
        seeds = [cluster.settings[i]["ClusterMemberListen"] for i in range(3)]
        assert status == 503
        assert f"2 of the 3 seeds disagree: ClusterDeliveryMode differs from {seeds[0]}'s: " \
            "Standard here, Guaranteed there" in reason or \
            f"ClusterDeliveryMode differs from {seeds[1]}'s: Standard here, Guaranteed there" \
            in reason, reason
        assert cluster.status(2)["ready"] is False

        body = json.dumps({"subject": "/odd/member", "content": "kept", "retained": True})
        request = urllib.request.Request(f"{cluster.http(0)}/publish", data=body.encode())
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert json.loads(reply.read())["status"] == "PUBLISH_OK"
        # acknowledged once a majority holds it; the other seed applies it at its next
        # heartbeat from the leader (a read at once got 404 in CI)
        snapshot = f"{cluster.http(1)}/snapshot?subject=/odd/member"
        deadline, held = time.monotonic() + 5, None
        while held is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(snapshot, timeout=5) as reply:
                    held = reply.read()
            except urllib.error.HTTPError as exc:
                if exc.code != 404:
                    raise
                time.sleep(0.05)
        assert held == b"kept"
        assert cluster.ready(0) and cluster.ready(1)
        refused = f"cluster link from {seeds[2]} refused: ClusterDeliveryMode differs from " \
            f"{seeds[2]}'s: Guaranteed here, Standard there"
        assert refused in cluster.log(0) + cluster.log(1)
    finally:
        cluster.stop()
