"""``GET /metrics``: Prometheus text from prometheus_client, parsed with its own parser,
moving as a scripted workload says it must."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from rawclient import RawClient

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.server import metric_buckets, metric_figures, metrics

SUBJECT = "/metrics/test/a"


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of one scrape."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as reply:
        assert reply.headers["Content-Type"] == metrics.CONTENT_TYPE
        text = reply.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_are_prometheus_text_with_the_connection_gauge(start_server: Any) -> None:
    server = start_server()
    http = server.url.replace("ws://", "http://")
    first = scrape(http)
    assert value(first, "migratory_ready") == 1
    assert value(first, "migratory_connections_open") == 1  # the scrape itself
    second = scrape(http)
    assert value(second, "migratory_connections_accepted_total") == value(
        first, "migratory_connections_accepted_total"
    ) + 1


def test_a_scripted_workload_moves_the_metrics_it_should(start_server: Any) -> None:
    server = start_server()
    http = server.url.replace("ws://", "http://")
    subscribers = [RawClient(server.port) for _ in range(3)]
    for number, client in enumerate(subscribers):
        client.connect(f"sub-{number}")
        client.subscribe(SUBJECT)
        client.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW)
    publisher = RawClient(server.port)
    publisher.connect("pub")
    before = scrape(http)
    for number in range(10):
        status = publisher.publish(Message(SUBJECT, b"x" * 50, closure=str(number)))
        assert status.status is ops.Status.PUBLISH_OK
    last = status.position
    for client in subscribers:
        assert len(client.recv_messages(10)) == 10
    # a denied subscribe (a meta-subject without the monitoring token), a resume that
    # recovers from the cache, a publish under /migratory/ and a broken HTTP request
    publisher.subscribe("/migratory/stats/x")
    deny = publisher.recv_op()
    assert isinstance(deny, ops.SubjectStatus) and deny.status is ops.Status.SUBSCRIBE_DENY
    assert last is not None
    resumer = RawClient(server.port)
    resumer.connect("resumer")
    resumer.subscribe(SUBJECT, position=Position(last.epoch, last.seq - 2))
    resumer.recv_ops_until_status(ops.Status.DATA_SYNC)
    refused = publisher.publish(Message("/migratory/stats/x", b"fake", closure="f"))
    assert refused.status is ops.Status.PUBLISH_DENIED
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as bad:
        bad.sendall(b"NOT HTTP\r\n\r\n")
        while bad.recv(4096):
            pass
    after = scrape(http)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("migratory_publishes_received_total") == 11
    assert moved("migratory_publishes_refused_total") == 1
    assert moved("migratory_messages_published_total") == 10
    assert moved("migratory_deliveries_total") == 30
    assert moved("migratory_publish_ack_seconds_count") == 10
    assert moved("migratory_publish_fanout_seconds_count") == 10
    assert moved("migratory_entitlement_denials_total", action="subscribe") == 1
    assert moved("migratory_entitlement_denials_total", action="publish") == 1
    assert moved("migratory_resumes_total", outcome="sync") == 1
    assert moved("migratory_protocol_errors_total", kind="http") == 1
    assert moved("migratory_bytes_written_total") >= 30 * 50
    assert moved("migratory_bytes_received_total") >= 10 * 50
    assert value(after, "migratory_subscriptions") == 4
    assert value(after, "migratory_subjects") == 1
    assert value(after, "migratory_cache_messages") == 10
    assert value(after, "migratory_frontend_connections", frontend="websocket") == 5
    # every socket write is one observation of the batch-size histogram
    writes = value(after, "migratory_socket_writes_total")
    assert writes > 0
    assert value(after, "migratory_write_batch_frames_count") == writes
    assert value(after, "migratory_write_batch_frames_bucket", le="+Inf") == writes


class FakeSource:
    def __init__(self, cluster: metric_figures.ClusterMetrics | None) -> None:
        self.timings = metric_figures.PublishTimings()
        self.batch_sizes = metric_buckets.BatchSizes()
        self._cluster = cluster

    def statistics(self) -> dict[str, Any]:
        return {"connections_open": 3, "subjects": "not a number", "slow_consumers": 2,
                "protocol_error_kinds": {"frame": 4}, "mqtt_session_positions_forgotten": 500,
                "mqtt_sessions_over_subject_bound": 1, "mqtt_positions_dropped": 9000,
                "subscriptions_refused": {"MaxSubscriptions": 7}}

    def ready(self) -> bool:
        return False

    def frontends(self) -> tuple[dict[str, int], int, int]:
        return {"websocket": 2, "http": 1}, 300, 200

    def cluster_metrics(self) -> metric_figures.ClusterMetrics | None:
        return self._cluster


def families(source: FakeSource) -> dict[str, Any]:
    text = metrics.render(metrics.registry_for(source)).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_the_collector_reads_the_source_at_scrape_time() -> None:
    source = FakeSource(None)
    for seconds in (0.0004, 0.003, 0.003, 7.0, 60.0):
        source.timings.ack.observe(seconds)
    found = families(source)
    assert found["migratory_ready"].samples[0].value == 0
    assert found["migratory_connections_open"].samples[0].value == 3
    assert "migratory_subjects" not in found  # not a number: left out
    assert found["migratory_slow_consumers"].samples[0].value == 2
    # MqttSessionMaxSubjects (docs/mqtt.md): what session records forgot, how many did
    assert found["migratory_mqtt_session_positions_forgotten"].samples[0].value == 500
    assert found["migratory_mqtt_sessions_over_subject_bound"].samples[0].value == 1
    # and what sessions dropped from memory (docs/mqtt.md, "In memory")
    assert found["migratory_mqtt_positions_dropped"].samples[0].value == 9000
    (refused,) = found["migratory_subscriptions_refused"].samples
    assert refused.labels == {"limit": "MaxSubscriptions"} and refused.value == 7
    (errors,) = found["migratory_protocol_errors"].samples
    assert errors.labels == {"kind": "frame"} and errors.value == 4
    ack = {(s.name, s.labels.get("le")): s.value
           for s in found["migratory_publish_ack_seconds"].samples}
    assert ack[("migratory_publish_ack_seconds_bucket", "0.0005")] == 1
    assert ack[("migratory_publish_ack_seconds_bucket", "0.005")] == 3
    assert ack[("migratory_publish_ack_seconds_bucket", "10.0")] == 4
    assert ack[("migratory_publish_ack_seconds_bucket", "+Inf")] == 5
    assert ack[("migratory_publish_ack_seconds_count", None)] == 5
    assert ack[("migratory_publish_ack_seconds_sum", None)] == pytest.approx(67.0064)
    assert found["migratory_outbox_bytes"].samples[0].value == 300
    assert "migratory_raft_term" not in found  # not a cluster member


def test_the_heartbeats_figures_are_metrics_and_absent_without_heartbeats() -> None:
    source = FakeSource(None)
    assert not any("heartbeat" in name for name in families(source))
    figures = {"sessions": 12, "sent": 40, "looks": 90, "looks_late": 7, "overdue": 3,
               "lag_seconds": 0.2}
    source.statistics = lambda: {"heartbeats": figures}  # type: ignore[method-assign]
    found = {name: family.samples[0].value for name, family in families(source).items()
             if "heartbeat" in name}
    assert found == {
        "migratory_heartbeat_sessions": 12, "migratory_heartbeats_sent": 40,
        "migratory_heartbeat_looks": 90, "migratory_heartbeat_looks_late": 7,
        "migratory_heartbeat_sessions_overdue": 3,
        "migratory_heartbeat_sweep_lag_seconds": 0.2,
    }


def test_heartbeats_sent_and_sessions_watched_move_with_a_client(start_server: Any) -> None:
    server = start_server(ClientHeartbeatMinimum="500")
    http = server.url.replace("ws://", "http://")
    before = scrape(http)
    assert value(before, "migratory_heartbeat_sessions") == 0
    older = RawClient(server.port)
    older.connect("asks-none")
    beating = RawClient(server.port)
    beating.send_op(ops.Connect(client="beating", heartbeat_ms=200))
    connected = beating.recv_op()
    assert isinstance(connected, ops.Connected) and connected.heartbeat_ms == 500
    for _ in range(2):
        assert beating.recv_op() == ops.Pong(None)
    during = scrape(http)
    assert value(during, "migratory_heartbeat_sessions") == 1  # the one that asked
    assert value(during, "migratory_heartbeats_sent_total") >= 2
    assert value(during, "migratory_heartbeat_looks_total") >= 2
    assert value(during, "migratory_heartbeat_looks_late_total") == 0
    assert value(during, "migratory_heartbeat_sessions_overdue") == 0
    assert value(during, "migratory_heartbeat_sweep_lag_seconds") == 0
    beating.close()
    for _ in range(500):  # bounded: until the server saw the close
        after = scrape(http)
        if value(after, "migratory_heartbeat_sessions") == 0:
            break
        time.sleep(0.01)
    assert value(after, "migratory_heartbeat_sessions") == 0
    assert value(after, "migratory_heartbeats_sent_total") >= value(
        during, "migratory_heartbeats_sent_total")


def test_cluster_metrics_come_from_the_member() -> None:
    latency = metric_buckets.Buckets(metric_buckets.LATENCY_BOUNDS)
    latency.observe(0.002)
    source = FakeSource(metric_figures.ClusterMetrics(
        member="m1:9800", role="seed", raft_state="leader", raft_term=7,
        raft_commit_index=120, raft_last_applied=119, raft_dump_failures=3, applied_clsn=118,
        raft_subjects=1_000_000, raft_snapshots=400_000, raft_slow_syncs=4,
        raft_sync_waiting=2.5,
        links=(metric_figures.PeerLink("m2:9801", "raft", True),
               metric_figures.PeerLink("m3:9801", "raft", False),
               metric_figures.PeerLink("m4:9800", "follower", True, lag=5)),
        commit_latency=latency,
        link_refusals=(("MAX_PENDING_HANDSHAKES", 2), ("LINK_CONNECTIONS_PER_SECOND", 30)),
        link_violations=(("frame_size", 1), ("origin", 0)),
        link_publishes_refused=(("MESSAGE_SIZE_LIMIT_EXCEEDED", 0), ("PUBLISH_FAILED", 3)),
        raft_front_refused=(("stale", 4), ("replayed", 0)), raft_front_skew=-130.5,
    ))
    found = families(source)
    states = {s.labels["state"]: s.value for s in found["migratory_raft_state"].samples}
    assert states == {"leader": 1, "follower": 0, "candidate": 0, "starting": 0}
    assert found["migratory_raft_term"].samples[0].value == 7
    assert found["migratory_raft_commit_index"].samples[0].value == 120
    assert found["migratory_cluster_applied_clsn"].samples[0].value == 118
    assert found["migratory_raft_dump_failures"].samples[0].value == 3
    assert found["migratory_raft_subjects"].samples[0].value == 1_000_000
    assert found["migratory_raft_snapshots"].samples[0].value == 400_000
    stale = {s.labels["reason"]: s.value
             for s in found["migratory_raft_front_refused"].samples if s.name.endswith("_total")}
    assert stale == {"stale": 4, "replayed": 0}
    assert found["migratory_raft_front_skew_seconds"].samples[0].value == -130.5
    assert found["migratory_raft_slow_syncs"].samples[0].value == 4
    assert found["migratory_raft_sync_waiting_seconds"].samples[0].value == 2.5
    up = {(s.labels["peer"], s.labels["kind"]): s.value
          for s in found["migratory_cluster_link_up"].samples}
    assert up == {("m2:9801", "raft"): 1, ("m3:9801", "raft"): 0, ("m4:9800", "follower"): 1}
    (lag,) = found["migratory_cluster_link_lag"].samples
    assert lag.labels == {"peer": "m4:9800", "kind": "follower"} and lag.value == 5
    commit = {s.name: s.value for s in found["migratory_raft_commit_seconds"].samples
              if s.name.endswith("_count")}
    assert commit == {"migratory_raft_commit_seconds_count": 1}
    refused = {s.labels["limit"]: s.value
               for s in found["migratory_cluster_link_refused"].samples}
    assert refused == {"MAX_PENDING_HANDSHAKES": 2, "LINK_CONNECTIONS_PER_SECOND": 30}
    violated = {s.labels["rule"]: s.value
                for s in found["migratory_cluster_link_violations"].samples}
    assert violated == {"frame_size": 1, "origin": 0}
    refused_publishes = {s.labels["status"]: s.value
                         for s in found["migratory_cluster_link_publishes_refused"].samples}
    assert refused_publishes == {"MESSAGE_SIZE_LIMIT_EXCEEDED": 0, "PUBLISH_FAILED": 3}


def test_batch_sizes_group_into_buckets_at_scrape_time() -> None:
    sizes = metric_buckets.BatchSizes()
    for frames in (1, 1, 3, 2000):
        sizes.observe(frames)
    grouped = sizes.buckets()
    assert sizes.count == grouped.count == 4
    assert grouped.sum == 2005
    cumulative = {
        s.labels["le"]: s.value
        for s in metrics.histogram(grouped, "b", "doc").samples
        if s.name == "b_bucket"
    }
    assert cumulative["1.0"] == 2 and cumulative["2.0"] == 2 and cumulative["4.0"] == 3
    assert cumulative["1024.0"] == 3 and cumulative["+Inf"] == 4


def test_mqtt_connections_and_protocol_errors_are_labelled_mqtt(start_server: Any) -> None:
    from paho_client import PahoClient

    server = start_server(ListenMqtt="127.0.0.1:0")
    http = server.url.replace("ws://", "http://")
    client = PahoClient(server.mqtt_port, "metered")
    try:
        with socket.create_connection(("127.0.0.1", server.mqtt_port), timeout=5) as bad:
            bad.sendall(b"\xf0\x00")  # packet type 15 is reserved: malformed
            while bad.recv(4096):
                pass
        assert client.subscribe("migratory/cluster", 0) == [0x80]  # no monitoring token
        after = scrape(http)
        assert value(after, "migratory_frontend_connections", frontend="mqtt") == 1
        assert value(after, "migratory_protocol_errors_total", kind="mqtt") == 1
        assert value(after, "migratory_entitlement_denials_total", action="subscribe") == 1
    finally:
        client.stop()


class WalkCountingSet(set):  # type: ignore[type-arg]
    """The server's connections, counting the walks over them."""

    walks = 0

    def __iter__(self) -> Any:
        self.walks += 1
        return super().__iter__()


def test_a_scrape_walks_no_connection_and_counts_each_front_end() -> None:
    """GET /metrics walked every connection for its per-front-end counts and outbox
    figures (25-45 ms at 100,000 connections, benchmarks/metrics_scrape.py): they are
    kept as connections open, upgrade and close. Real connections of each front end."""
    from migratory.config import load_config
    from migratory.protocol import mqtt
    from migratory.protocol import websocket as ws
    from migratory.protocol.http import (
        MQTT_SUBPROTOCOL,
        Request,
        handshake_request,
        new_websocket_key,
    )
    from migratory.protocol.mqtt_encode import encode_packet
    from migratory.server.app import Server

    server = Server(load_config(overrides={"Listen": "127.0.0.1:0"}, environ={}))
    connections = WalkCountingSet()
    server.connections = connections
    scrape_request = Request("GET", "/metrics", "/metrics", {}, ())
    connect = ws.encode_masked_binary(ops.encode_client_op(ops.Connect("m")), b"mask")
    mqtt_connect = ws.encode_masked_binary(encode_packet(mqtt.Connect("m")), b"mask")
    heads = {
        "websocket": handshake_request("127.0.0.1", "/", new_websocket_key()) + connect,
        "mqtt": handshake_request("127.0.0.1", "/", new_websocket_key(),
                                  subprotocol=MQTT_SUBPROTOCOL) + mqtt_connect,
        "sse": b"GET /events?subject=/metrics/test/a HTTP/1.1\r\nHost: x\r\n\r\n",
        "http": b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    }
    wanted = {"websocket": 3, "mqtt": 2, "sse": 2, "http": 1}

    def frontends() -> dict[str, float]:
        walks = connections.walks
        answer = server.monitor.route(scrape_request, monitoring_listener=True)
        assert connections.walks == walks, "the scrape walked the connections"
        assert answer is not None
        text = answer.split(b"\r\n\r\n", 1)[1].decode()
        return {sample.labels["frontend"]: sample.value
                for family in text_string_to_metric_families(text)
                if family.name == "migratory_frontend_connections"
                for sample in family.samples}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            (host, port), *_ = await nursery.start(server.serve)
            streams = []
            for frontend, count in wanted.items():
                for _ in range(count):
                    stream = await trio.open_tcp_stream(host, port)
                    await stream.send_all(heads[frontend])
                    assert await stream.receive_some(65536)  # answered: upgraded, streaming
                    streams.append(stream)
            for _ in range(100):  # bounded: the server has processed what each sent
                if all(c.session.connected or c.session.frontend == "http"
                       for c in list(server.connections)):
                    break
                await trio.sleep(0.01)
            assert frontends() == wanted
            walked: dict[str, int] = {}
            for connection in list(server.connections):
                walked[connection.session.frontend] = walked.get(connection.session.frontend,
                                                                 0) + 1
            assert walked == wanted
            for stream in streams:
                await stream.aclose()
            for _ in range(1000):  # bounded; ends as soon as the server saw every close
                if not server.connections:
                    break
                await trio.sleep(0.01)
            assert frontends() == {}
            nursery.cancel_scope.cancel()

    trio.run(main)


# A server built as ``serve`` builds it (a cluster member's modules imported too), then
# scraped once through its monitor's route: what it had imported before, and after.
FIRST_SCRAPE = """
import sys

import cluster.node
from cluster.members import build_node
from migratory.config import load_config, parse_set_options
from migratory.protocol.http import Request

server, _ = build_node(load_config(None, overrides=parse_set_options(["Listen=127.0.0.1:0"])))
before = "prometheus_client" in sys.modules
answer = server.monitor.route(Request("GET", "/metrics", "/metrics", {}, ()),
                              monitoring_listener=True)
print(before, "prometheus_client" in sys.modules, answer.split(b"\\r\\n", 1)[0].decode())
"""


def test_prometheus_client_is_imported_at_the_first_scrape_not_at_start_up() -> None:
    """A server or member starting never imports ``prometheus_client`` (with http.server,
    email, wsgiref...: ~40 ms of CPU of each process start); its first scrape does."""
    done = subprocess.run([sys.executable, "-c", FIRST_SCRAPE], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "HTTP/1.1", "200", "OK"], done.stdout
