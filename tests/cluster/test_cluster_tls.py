"""Mutual TLS on the cluster links with real member processes on 127.0.0.1: a cluster
whose members hold certificates of the cluster CA commits and fails over; a member with
the right password but no certificate, or one from another CA, is refused."""

from __future__ import annotations

import socket
import ssl
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trustme
from cluster_fixture import LocalCluster

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from rawclient import RawClient, delivered

from migratory.certificates import make_cluster_certificates
from migratory.config import Config, ConfigError
from migratory.model.message import Message, MessageType
from migratory.protocol import ops

SUBJECT = "/Cluster/Tls/Scores"


def tls_cluster(tmp_path: Path, members: int = 4) -> LocalCluster:
    cluster = LocalCluster(tmp_path, members=members, seeds=3)
    made = make_cluster_certificates(
        tmp_path / "cluster-tls", {f"m{i}": ["127.0.0.1"] for i in range(members)}
    )
    for i, settings in enumerate(cluster.settings):
        settings.update(made[f"m{i}"].settings())
    return cluster


def cluster_port(cluster: LocalCluster, index: int) -> int:
    return int(cluster.settings[index]["ClusterMemberListen"].rsplit(":", 1)[1])


def publish(client: RawClient, content: bytes, closure: str) -> ops.PublishStatus:
    return client.publish(Message(SUBJECT, content, retained=True, closure=closure))


def test_certificates_are_signed_by_the_ca_and_keys_are_private(tmp_path: Path) -> None:
    made = make_cluster_certificates(tmp_path, {"a": ["127.0.0.1"], "b": ["*.members"]})
    for files in made.values():
        assert files.key.stat().st_mode & 0o077 == 0
        context = ssl.create_default_context(cafile=str(files.ca))
        context.load_cert_chain(files.certificate, files.key)  # the pair matches
    assert made["a"].ca == made["b"].ca


@pytest.fixture
def cluster4(tmp_path: Path) -> Any:
    cluster = tls_cluster(tmp_path)
    cluster.start_all()
    try:
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop()


def test_a_cluster_with_mutual_tls_commits_and_fails_over(cluster4: LocalCluster) -> None:
    cluster = cluster4
    subscriber = RawClient(cluster.port(3))  # a non-seed: replicates over a TLS link
    subscriber.connect("sub")
    subscriber.subscribe(SUBJECT)
    publisher = RawClient(cluster.port(3), timeout=15)  # forwards to a seed over TLS
    publisher.connect("pub")
    first = publish(publisher, b"before", "1")
    assert first.status is ops.Status.PUBLISH_OK, first

    leader = cluster.leader()
    cluster.kill(leader)
    acked = [b"before"]
    deadline = time.monotonic() + 30
    i = 0
    while len(acked) < 6 and time.monotonic() < deadline:
        i += 1
        status = publish(publisher, f"after-{i}".encode(), str(i + 1))
        if status.status is ops.Status.PUBLISH_OK:
            acked.append(f"after-{i}".encode())
        else:
            time.sleep(0.2)
    assert len(acked) == 6, "no commit after the leader was killed"
    assert cluster.leader() != leader

    got: list[Message] = []
    deadline = time.monotonic() + 20
    while not set(acked) <= {m.content for m in got} and time.monotonic() < deadline:
        got.extend(delivered([subscriber.recv_op(timeout=max(0.1, deadline - time.monotonic()))]))
    updates = [m.content for m in got if m.type is not MessageType.SNAPSHOT]
    assert [c for c in updates if c in set(acked)] == acked
    links = "".join(cluster.log(i) for i in range(4))
    assert "TLS handshake failed" not in links


def test_a_member_without_the_cluster_certificate_is_refused(tmp_path: Path) -> None:
    cluster = tls_cluster(tmp_path)
    other_ca = make_cluster_certificates(tmp_path / "other-ca", {"m3": ["127.0.0.1"]})
    cluster.settings[3].update(other_ca["m3"].settings())  # the right password, wrong CA
    try:
        cluster.start_all()
        cluster.wait_ready(range(3))
        cluster.wait_refused(3, "3 of the 3 seeds disagree: TLS handshake failed",
                             "cluster link refused: TLS handshake failed")
        assert not cluster.ready(3)
        seed_logs = "".join(cluster.log(i) for i in range(3))
        assert "cluster link refused: TLS handshake failed" in seed_logs
    finally:
        cluster.stop()


def test_a_member_without_tls_is_refused(tmp_path: Path) -> None:
    cluster = tls_cluster(tmp_path)
    for key in ("ClusterTlsCertificate", "ClusterTlsKey", "ClusterTlsCa"):
        del cluster.settings[3][key]  # plain TCP, the right password
    try:
        cluster.start_all()
        cluster.wait_ready(range(3))
        # the plain member waits for a challenge, the seed for a TLS hello: the seed ends
        # it after HANDSHAKE_TIMEOUT (5 s)
        deadline = time.monotonic() + 12
        refused = "cluster link refused: TLS handshake failed"
        while time.monotonic() < deadline:
            if refused in "".join(cluster.log(i) for i in range(3)):
                break
            time.sleep(0.2)
        assert refused in "".join(cluster.log(i) for i in range(3))
        assert not cluster.ready(3)
    finally:
        cluster.stop()


def test_the_link_port_asks_for_a_client_certificate(cluster4: LocalCluster) -> None:
    """A TLS client that trusts the cluster CA but shows no certificate, or one of another
    CA, never gets a byte of the link protocol."""
    ca_file = cluster4.settings[0]["ClusterTlsCa"]
    stranger = trustme.CA().issue_cert("127.0.0.1")
    for certificate in (None, stranger):
        context = ssl.create_default_context(cafile=ca_file)
        context.check_hostname = False
        if certificate is not None:
            certificate.configure_cert(context)
        address = ("127.0.0.1", cluster_port(cluster4, 0))
        with (
            socket.create_connection(address, timeout=5) as raw,
            context.wrap_socket(raw) as tls,  # TLS 1.3: the refusal comes on first read
            pytest.raises((ssl.SSLError, ConnectionError)),
        ):
            tls.sendall(b"hello")
            if not tls.recv(1024):
                raise ConnectionError("closed without a byte")


def test_cluster_tls_config_errors_name_the_key(tmp_path: Path) -> None:
    made = make_cluster_certificates(tmp_path, {"m0": ["127.0.0.1"]})["m0"]
    base = {
        "ClusterMembers": "127.0.0.1:9100, 127.0.0.1:9110",
        "ClusterMemberListen": "127.0.0.1:9100",
        "ClusterPassword": "secret",
    }
    good = Config.from_mapping({**base, **made.settings()})
    assert good.cluster_tls_ca == str(made.ca)
    cases = [
        ({"ClusterTlsCertificate": str(made.certificate)}, r"ClusterTlsKey is required"),
        ({**made.settings(), "ClusterTlsCa": str(tmp_path / "none.pem")},
         r"ClusterTlsCa \(from setting\): no such file"),
        ({**made.settings(), "ClusterTlsKey": str(made.certificate)},
         r"ClusterTlsKey \(from setting\): .* holds no PEM private key"),
        ({**made.settings(), "ClusterTlsCa": str(made.key)}, r"ClusterTlsCa \(from setting\): "),
    ]
    for extra, message in cases:
        with pytest.raises(ConfigError, match=message):
            Config.from_mapping({**base, **extra})
    alone = r"ClusterTlsCertificate \(from setting\) is set but ClusterMembers"
    with pytest.raises(ConfigError, match=alone):
        Config.from_mapping(made.settings())
