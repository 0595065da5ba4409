"""Members whose files differ (one pod of a rolling change, one file edited by hand):
real processes, for the settings that decide what a member takes, keeps and sends
(cluster/agreement.py; docs/cluster.md, "Members must agree").

- ``MaxMessageSize`` / ``MaxFrameSize``: must be equal. Before, a seed configured with
  the larger sizes had a 5.5 MB publish acknowledged; the non-seed's links then refused
  every batch carrying it (``frame of 5500071 bytes exceeds the limit of 5308416``, 69
  times in 5 s) and it replicated nothing more: a message published afterwards on another
  seed never reached it, and it stayed not ready. Now the seeds refuse the odd one, which
  is not ready and never runs Raft, and the rest serves.
- ``ClusterTls*``: one member left without them. Before, in Standard mode it was ready
  and served its clients alone (every question to the members with TLS timed out,
  counting for nothing); now it is not ready, its readiness naming the keys.
- ``MaxCachedMessagesPerSubject``: may differ. A member with the smaller cache answers a
  resume it can still serve with exactly the missed messages and ``sync``, and one that
  reaches back further than its cache with the snapshot and ``resync``: never a gap.
"""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from cluster_fixture import LocalCluster

from migratory.certificates import make_cluster_certificates

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from httpclient import HttpClient, SseClient

BIG = {"MaxMessageSize": "6000000", "MaxFrameSize": "8388608",
       "ClientMaxPendingBytes": "16777216"}


def publish(cluster: LocalCluster, index: int, subject: str, content: str) -> str:
    """The status of an HTTP publish (retained), or why there was none."""
    body = json.dumps({"subject": subject, "content": content, "retained": True}).encode()
    request = urllib.request.Request(f"{cluster.http(index)}/publish", data=body)
    try:
        with urllib.request.urlopen(request, timeout=15) as reply:
            return str(json.loads(reply.read())["status"])
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except OSError as exc:
        return f"no answer: {exc}"


def snapshot(cluster: LocalCluster, index: int, subject: str) -> bytes | None:
    try:
        with urllib.request.urlopen(
            f"{cluster.http(index)}/snapshot?subject={subject}", timeout=5
        ) as reply:
            return bytes(reply.read())
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 503):
            return None
        raise


def readyz(cluster: LocalCluster, index: int) -> str:
    try:
        with urllib.request.urlopen(f"{cluster.http(index)}/readyz", timeout=2) as reply:
            return f"{reply.status} {reply.read().decode()}"
    except urllib.error.HTTPError as exc:
        return f"{exc.code} {exc.read().decode()}"
    except OSError as exc:  # not listening yet
        return f"no answer: {exc}"


def wait_for(what: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := what()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def test_a_seed_with_larger_message_sizes_is_refused_and_the_non_seed_keeps_replicating(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path, members=4)
    try:
        # a new cluster elects its first leader with every seed (docs/cluster.md): the
        # odd file comes with a restart, as in a rolling config change
        cluster.start_all()
        cluster.wait_ready()
        cluster.kill(0, signal.SIGTERM)
        cluster.settings[0].update(BIG)
        cluster.start(0)
        settled = wait_for(lambda: (r := readyz(cluster, 0)).startswith("200")
                           or "MaxMessageSize" in r, 15)  # ready before; refused now
        assert settled, readyz(cluster, 0)
        # whatever the odd seed answers, a message only it takes must not stop the others
        big = publish(cluster, 0, "/limits/big", "x" * 5_500_000)
        assert publish(cluster, 1, "/limits/after", "after") == "PUBLISH_OK"
        held = wait_for(lambda: snapshot(cluster, 3, "/limits/after"), 10)
        assert held == b"after", (big, readyz(cluster, 3), cluster.log(3)[-2000:])
        assert cluster.ready(3), readyz(cluster, 3)
        assert big != "PUBLISH_OK", big
        seeds = [cluster.settings[i]["ClusterMemberListen"] for i in range(3)]
        reason = readyz(cluster, 0)
        assert reason.startswith("503 "), reason
        assert "2 of the 3 seeds disagree: MaxMessageSize differs from " in reason, reason
        assert ": 6000000 here, 131072 there" in reason, reason
        assert f"cluster link from {seeds[0]} refused: MaxMessageSize differs from " \
            f"{seeds[0]}'s: 131072 here, 6000000 there" in cluster.log(1) + cluster.log(2)
        assert cluster.status(0).get("raft_state") is None  # it runs no Raft
    finally:
        cluster.stop()


def test_a_standard_member_left_without_cluster_tls_is_not_ready(tmp_path: Path) -> None:
    """Before: the member without the ClusterTls* keys heard nothing from the members
    with them (they wait for a ClientHello; it waits for their challenge), so each
    question timed out, "not asked", counting for nothing: a Standard member was ready and
    served its clients alone, its publishes never forwarded (ready 200 for 30 s on end).
    Now a link that heard nothing asks whether the peer answers TLS, and says so."""
    cluster = LocalCluster(tmp_path, members=3, mode="Standard")
    made = make_cluster_certificates(tmp_path / "tls", {f"m{i}": ["127.0.0.1"] for i in (0, 1)})
    for i in (0, 1):
        cluster.settings[i].update(made[f"m{i}"].settings())
    try:
        cluster.start_all()
        reason = wait_for(lambda: "seeds disagree: " in (r := readyz(cluster, 2)) and r, 30)
        assert reason, (readyz(cluster, 2), cluster.log(2)[-2000:])
        assert reason.startswith("503 2 of the 3 seeds disagree: "), reason
        assert "answers only TLS on its cluster port and this member's cluster links are " \
            "not TLS: ClusterTlsCertificate, ClusterTlsKey and ClusterTlsCa are set there, " \
            "not here" in reason, reason
        assert "(a TLS handshake: ClusterTlsCertificate" in cluster.log(2)
        assert "(the peer answers without TLS" in cluster.log(0) + cluster.log(1)
        cluster.wait_ready([0, 1])
    finally:
        cluster.stop()


def resume(port: int, subject: str, last_id: str) -> list[dict[str, Any]]:
    stream = SseClient(port, [subject], last_event_id=last_id)
    try:
        assert stream.wait_head() == 200
        events: list[dict[str, Any]] = []
        while not events or events[-1]["event"] not in ("sync", "resync"):
            event = stream.next_event(timeout=10)
            assert event is not None, events
            events.append(event)
        return events
    finally:
        stream.close()


def test_a_member_with_a_smaller_cache_resumes_or_resyncs_never_a_gap(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=4)
    cluster.settings[3]["MaxCachedMessagesPerSubject"] = "5"
    subject = "/limits/cache"
    try:
        cluster.start_all()
        cluster.wait_ready()
        client = HttpClient(cluster.port(0))
        positions = []
        for i in range(1, 21):
            status, body = client.publish(subject=subject, content=f"m{i}", retained=True)
            assert status == 200 and body["status"] == "PUBLISH_OK", body
            positions.append((body["epoch"], body["seq"]))
        client.close()
        epoch = positions[0][0]
        assert [seq for _, seq in positions] == list(range(1, 21))
        assert wait_for(lambda: snapshot(cluster, 3, subject) == b"m20", 10)

        near = resume(cluster.port(3), subject, f"{epoch}:17")  # within its 5
        assert [(e["data"]["seq"], e["data"]["type"]) for e in near if e["event"] == "message"] \
            == [(18, "recovered"), (19, "recovered"), (20, "recovered")]
        assert [e["event"] for e in near][-1] == "sync"

        far = resume(cluster.port(3), subject, f"{epoch}:2")  # past its cache
        assert [e["event"] for e in far][-1] == "resync", far
        told = [(e["data"]["seq"], e["data"]["type"]) for e in far if e["event"] == "message"]
        assert told == [(20, "snapshot")], told

        full = resume(cluster.port(1), subject, f"{epoch}:2")  # a seed's cache of 1000
        assert [e["data"]["seq"] for e in full if e["event"] == "message"] == list(range(3, 21))
        assert [e["event"] for e in full][-1] == "sync"
        assert "MaxCachedMessagesPerSubject differs" in cluster.log(3)
    finally:
        cluster.stop()
