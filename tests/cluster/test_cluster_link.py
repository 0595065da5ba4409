"""The cluster link handshake: authentication, replay and reflection, handshake
strictness, API misuse; and that link and link_ops do no I/O.

Operations, framing and strict decoding are in test_cluster_link_ops.py.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import ssl
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cluster_link_pair import (
    ACCEPTOR,
    CONNECTOR,
    PASSWORD,
    drain,
    feed_bytewise,
    frame,
    open_pair,
    pair,
    payload_of,
)

from cluster import link, link_ops
from cluster.link import Authenticated, Heartbeat, LinkConnection, LinkError, Outgoing, TlsProbe
from cluster.link_io import probe_context


def mac(password: str, label: bytes, nonce: bytes, member: str) -> bytes:
    return hmac.new(password.encode(), label + nonce + member.encode(), hashlib.sha256).digest()


# --- handshake -------------------------------------------------------------------


def test_full_handshake_events_and_wire() -> None:
    acceptor, connector = pair()
    assert not acceptor.authenticated and acceptor.peer is None
    assert connector.initiate() == b""
    assert connector.next_event() is None

    challenge = acceptor.initiate()
    nonce_a = (1).to_bytes(16, "big")
    assert payload_of(challenge) == {"t": "challenge", "n": nonce_a, "m": ACCEPTOR}
    assert acceptor.next_event() is None

    connector.receive_data(challenge)
    auth = connector.next_event()
    assert isinstance(auth, Outgoing)
    assert connector.next_event() is None
    assert not connector.authenticated
    nonce_c = (1000).to_bytes(16, "big")
    assert payload_of(auth.data) == {
        "t": "auth",
        "m": CONNECTOR,
        "n": nonce_c,
        "mac": mac(PASSWORD, b"migratory-link-1|accept|", nonce_a, CONNECTOR),
    }

    acceptor.receive_data(auth.data)
    welcome = acceptor.next_event()
    assert isinstance(welcome, Outgoing)
    assert payload_of(welcome.data) == {
        "t": "welcome",
        "mac": mac(PASSWORD, b"migratory-link-1|connect|", nonce_c, ACCEPTOR),
    }
    assert not acceptor.authenticated  # not before the welcome has been taken
    with pytest.raises(ValueError):
        acceptor.send(Heartbeat(1))
    assert acceptor.next_event() == Authenticated(CONNECTOR)
    assert acceptor.authenticated and acceptor.peer == CONNECTOR
    assert acceptor.next_event() is None

    connector.receive_data(welcome.data)
    assert connector.next_event() == Authenticated(ACCEPTOR)
    assert connector.authenticated and connector.peer == ACCEPTOR
    assert connector.next_event() is None


def test_default_nonces_are_fresh() -> None:
    first = LinkConnection(role="accept", member=ACCEPTOR, password=PASSWORD).initiate()
    second = LinkConnection(role="accept", member=ACCEPTOR, password=PASSWORD).initiate()
    assert payload_of(first)["n"] != payload_of(second)["n"]
    assert len(payload_of(first)["n"]) == 16


def test_ops_following_the_welcome_in_one_read() -> None:
    acceptor, connector = pair()
    connector.initiate()
    connector.receive_data(acceptor.initiate())
    (auth,) = drain(connector)
    acceptor.receive_data(auth.data)
    welcome, _ = drain(acceptor)
    connector.receive_data(welcome.data + acceptor.send(Heartbeat(7)))
    assert drain(connector) == [Authenticated(ACCEPTOR), Heartbeat(7)]


def test_acceptor_rejects_a_wrong_password() -> None:
    acceptor, connector = pair(connector_password="wrong")
    connector.initiate()
    connector.receive_data(acceptor.initiate())
    (auth,) = drain(connector)
    acceptor.receive_data(auth.data)
    with pytest.raises(LinkError, match=r"^authentication failed: bad mac"):
        acceptor.next_event()
    assert not acceptor.authenticated
    with pytest.raises(LinkError, match=r"^authentication failed"):
        acceptor.next_event()  # the failure is final


def test_connector_rejects_an_acceptor_without_the_password() -> None:
    # An impostor acceptor: it cannot compute the welcome without the password.
    connector = LinkConnection(role="connect", member=CONNECTOR, password=PASSWORD)
    connector.initiate()
    nonce_a = b"\x01" * 16
    connector.receive_data(frame({"t": "challenge", "n": nonce_a, "m": ACCEPTOR}))
    (auth,) = drain(connector)
    nonce_c = payload_of(auth.data)["n"]
    forged = mac("wrong", b"migratory-link-1|connect|", nonce_c, ACCEPTOR)
    connector.receive_data(frame({"t": "welcome", "mac": forged}))
    with pytest.raises(LinkError, match=r"^authentication failed: bad mac"):
        connector.next_event()
    assert not connector.authenticated and connector.peer is None


def test_connector_checks_the_welcome_is_bound_to_the_challengers_name() -> None:
    connector = LinkConnection(role="connect", member=CONNECTOR, password=PASSWORD)
    connector.initiate()
    connector.receive_data(frame({"t": "challenge", "n": b"\x01" * 16, "m": ACCEPTOR}))
    (auth,) = drain(connector)
    nonce_c = payload_of(auth.data)["n"]
    other = mac(PASSWORD, b"migratory-link-1|connect|", nonce_c, "10.0.0.9:8801")
    connector.receive_data(frame({"t": "welcome", "mac": other}))
    with pytest.raises(LinkError, match=r"^authentication failed"):
        connector.next_event()


def test_replayed_auth_is_rejected() -> None:
    acceptor, connector = pair()
    connector.initiate()
    connector.receive_data(acceptor.initiate())
    (recorded,) = drain(connector)

    fresh = LinkConnection(role="accept", member=ACCEPTOR, password=PASSWORD)
    fresh.initiate()
    fresh.receive_data(recorded.data)
    with pytest.raises(LinkError, match=r"^authentication failed: bad mac"):
        fresh.next_event()


def test_replayed_welcome_is_rejected() -> None:
    acceptor, connector = pair()
    connector.initiate()
    connector.receive_data(acceptor.initiate())
    (auth,) = drain(connector)
    acceptor.receive_data(auth.data)
    recorded, _ = drain(acceptor)

    fresh = LinkConnection(role="connect", member=CONNECTOR, password=PASSWORD)
    fresh.initiate()
    fresh.receive_data(pair()[0].initiate())  # the same challenge as before
    drain(fresh)
    fresh.receive_data(recorded.data)
    with pytest.raises(LinkError, match=r"^authentication failed: bad mac"):
        fresh.next_event()


def test_reflected_mac_is_rejected() -> None:
    # A connect-labelled mac (what an acceptor would send) never passes as an auth.
    acceptor, _ = pair()
    nonce_a = payload_of(acceptor.initiate())["n"]
    reflected = mac(PASSWORD, b"migratory-link-1|connect|", nonce_a, CONNECTOR)
    acceptor.receive_data(frame({"t": "auth", "m": CONNECTOR, "n": b"\x02" * 16, "mac": reflected}))
    with pytest.raises(LinkError, match=r"^authentication failed: bad mac"):
        acceptor.next_event()


@pytest.mark.parametrize(
    "role, data",
    [
        ("accept", b"GET / HTTP/1.1\r\n\r\n"),
        ("accept", frame({"t": "hb", "c": 1})),
        ("accept", frame({"t": "challenge", "n": b"\x01" * 16, "m": CONNECTOR})),
        ("accept", frame({"t": "welcome", "mac": b"\x00" * 32})),
        ("accept", frame({"t": "auth", "m": CONNECTOR, "n": b"\x01" * 15, "mac": b"\x00" * 32})),
        ("accept", frame({"t": "auth", "m": CONNECTOR, "n": b"\x01" * 16, "mac": b"\x00" * 31})),
        ("accept", frame({"t": "auth", "m": "", "n": b"\x01" * 16, "mac": b"\x00" * 32})),
        ("accept", frame({"t": "auth", "m": CONNECTOR, "n": b"\x01" * 16})),
        ("accept", frame({"t": "auth", "m": 1, "n": b"\x01" * 16, "mac": b"\x00" * 32})),
        ("accept", frame([1, 2, 3])),
        ("accept", frame({"t": "auth"})[:-1] + b"\xff"),
        ("accept", struct.pack(">I", link.MAX_HANDSHAKE_FRAME + 1)),
        ("connect", frame({"t": "auth", "m": CONNECTOR, "n": b"\x01" * 16, "mac": b"\x00" * 32})),
        ("connect", frame({"t": "welcome", "mac": b"\x00" * 32})),
        ("connect", frame({"t": "challenge", "n": b"\x01" * 16})),
        ("connect", frame({"t": "challenge", "n": b"\x01" * 16, "m": ACCEPTOR, "x": 1})),
        ("connect", frame({"t": "b", "c": 1, "m": [], "o": []})),
        ("connect", b"\x00\x00\x00\x00"),
    ],
)
def test_anything_but_the_expected_handshake_frame_fails(role: Any, data: bytes) -> None:
    conn = LinkConnection(role=role, member=CONNECTOR, password=PASSWORD)
    conn.initiate()
    conn.receive_data(data)
    with pytest.raises(LinkError, match=r"^authentication failed: "):
        conn.next_event()
    assert not conn.authenticated


def test_handshake_frame_after_authentication_fails() -> None:
    acceptor, _ = open_pair()
    acceptor.receive_data(
        frame({"t": "auth", "m": CONNECTOR, "n": b"\x01" * 16, "mac": b"\x00" * 32})
    )
    with pytest.raises(LinkError, match="handshake frame 'auth' after authentication"):
        acceptor.next_event()


def test_api_misuse_is_a_value_error() -> None:
    acceptor, connector = pair()
    with pytest.raises(ValueError, match="initiate"):
        acceptor.next_event()
    with pytest.raises(ValueError, match="not authenticated"):
        connector.send(Heartbeat(1))
    acceptor.initiate()
    with pytest.raises(ValueError, match="already"):
        acceptor.initiate()
    with pytest.raises(ValueError, match="ClusterPassword"):
        LinkConnection(role="accept", member=ACCEPTOR, password="")
    with pytest.raises(ValueError, match="member"):
        LinkConnection(role="accept", member="", password=PASSWORD)
    with pytest.raises(ValueError, match="role"):
        LinkConnection(role="listen", member=ACCEPTOR, password=PASSWORD)  # type: ignore[arg-type]
    short = LinkConnection(
        role="accept", member=ACCEPTOR, password=PASSWORD, nonce_source=lambda n: b"\x00"
    )
    with pytest.raises(ValueError, match="nonce_source"):
        short.initiate()


def test_handshake_bytewise() -> None:
    acceptor, connector = pair()
    connector.initiate()
    (auth,) = feed_bytewise(connector, acceptor.initiate())
    welcome, authenticated = feed_bytewise(acceptor, auth.data)
    assert authenticated == Authenticated(CONNECTOR)
    assert feed_bytewise(connector, welcome.data) == [Authenticated(ACCEPTOR)]


# --- purity ---------------------------------------------------------------------------


FORBIDDEN = {"trio", "socket", "selectors", "asyncio", "threading", "pysyncobj"}


@pytest.mark.parametrize("module", [link, link_ops], ids=["link", "link_ops"])
def test_link_imports_no_io(module: Any) -> None:
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported if name.split(".")[0] in FORBIDDEN}


def test_link_imports_no_io_transitively() -> None:
    code = "import sys, cluster.link; print(' '.join(sorted(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert not {name for name in loaded if name.split(".")[0] in FORBIDDEN}


def client_hello(context: ssl.SSLContext) -> bytes:
    """The first flight of a TLS client with ``context``, as a socket would carry it."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_a_members_tls_probe_is_told_from_a_member_with_tls_keys() -> None:
    """A member that heard nothing from a peer asks it whether its links are TLS
    (cluster/link_io.py speaks_tls): the probe is a question, not a misconfiguration."""
    probe = LinkConnection(role="accept", member=ACCEPTOR, password=PASSWORD)
    probe.initiate()
    probe.receive_data(client_hello(probe_context()))
    with pytest.raises(TlsProbe, match="asked whether its cluster links are TLS"):
        probe.next_event()
    member = LinkConnection(role="accept", member=ACCEPTOR, password=PASSWORD)
    member.initiate()
    member.receive_data(client_hello(ssl.create_default_context()))  # ClusterTls* there
    with pytest.raises(LinkError, match=r"\(a TLS handshake: ClusterTlsCertificate") as info:
        member.next_event()
    assert not isinstance(info.value, TlsProbe)


def test_a_tls_client_hello_on_a_plain_link_is_named() -> None:
    """A member with the ClusterTls* keys dialling one without: before, the acceptor only
    logged "frame of 369295616 bytes exceeds the limit of 4096"."""
    conn = LinkConnection(role="accept", member=ACCEPTOR, password=PASSWORD)
    conn.initiate()
    conn.receive_data(bytes.fromhex("160301020001") + b"\x00" * 40)  # a ClientHello's start
    with pytest.raises(LinkError, match=r"^authentication failed: frame of \d+ bytes "
                       r"exceeds the limit of \d+ \(a TLS handshake: ClusterTlsCertificate"):
        conn.next_event()
