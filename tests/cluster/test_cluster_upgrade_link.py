"""The cluster link of today against a fake 524f73f peer: the bytes that version writes.

``upgrade_fixture/recorded-524f73f.json`` holds them, recorded from 524f73f's own
``cluster.link`` with fixed nonces (``upgrade_fixture/record_524f73f.py``): its handshake as
each side writes it and one frame of each operation. Members of 524f73f and of today
link (docs/cluster.md, "Upgrading"): the handshake of link version 1 is byte for byte
the old one both ways, and every operation the old member writes decodes here and is
written back here as the same bytes, so the old member reads what this one writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cluster_link_pair import ACCEPTOR, CONNECTOR, PASSWORD
from cluster_link_pair import counting_nonces as nonces

from cluster import link
from cluster.link_limits import LINK_VERSION, accepted_frame_limit
from migratory.config import load_config

RECORDED = json.loads(
    (Path(__file__).resolve().parent / "upgrade_fixture" / "recorded-524f73f.json").read_text()
)
HANDSHAKE = {name: bytes.fromhex(data) for name, data in RECORDED["handshake"].items()}
OPERATIONS = {name: bytes.fromhex(data) for name, data in RECORDED["operations"].items()}


def events(conn: link.LinkConnection, data: bytes) -> list[Any]:
    conn.receive_data(data)
    return list(iter(conn.next_event, None))


def test_this_code_speaks_the_link_version_of_524f73f() -> None:
    # raising it needs the upgrade section of docs/cluster.md rewritten, and this file
    assert LINK_VERSION == 1


def test_an_acceptor_of_today_links_with_a_dialler_of_524f73f() -> None:
    acceptor = link.LinkConnection(role="accept", member=ACCEPTOR, password=PASSWORD,
                                   nonce_source=nonces(1))
    assert acceptor.initiate() == HANDSHAKE["challenge"]
    welcome, authenticated = events(acceptor, HANDSHAKE["auth"])
    assert welcome == link.Outgoing(HANDSHAKE["welcome"])
    assert authenticated == link.Authenticated(CONNECTOR)


def test_a_dialler_of_today_links_with_an_acceptor_of_524f73f() -> None:
    connector = link.LinkConnection(role="connect", member=CONNECTOR, password=PASSWORD,
                                    nonce_source=nonces(1000))
    assert connector.initiate() == b""
    assert events(connector, HANDSHAKE["challenge"]) == [link.Outgoing(HANDSHAKE["auth"])]
    assert events(connector, HANDSHAKE["welcome"]) == [link.Authenticated(ACCEPTOR)]


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_an_operation_of_524f73f_decodes_and_is_written_back_the_same(name: str) -> None:
    frame = OPERATIONS[name]
    op = link.decode_op(frame[4:])
    assert link.encode_frame(op) == frame


@pytest.mark.parametrize("role", ["accept", "connect"])
def test_a_link_of_today_takes_every_operation_of_524f73f_after_its_handshake(
    role: str,
) -> None:
    """Each side as the link adapter runs it (an acceptor with its smaller frame limit)."""
    if role == "accept":
        limit = accepted_frame_limit(load_config(environ={}).max_frame_size)
        conn = link.LinkConnection(role="accept", member=ACCEPTOR, password=PASSWORD,
                                   nonce_source=nonces(1), max_frame=limit)
        conn.initiate()
        events(conn, HANDSHAKE["auth"])
    else:
        conn = link.LinkConnection(role="connect", member=CONNECTOR, password=PASSWORD,
                                   nonce_source=nonces(1000))
        conn.initiate()
        events(conn, HANDSHAKE["challenge"])
        events(conn, HANDSHAKE["welcome"])
    assert conn.authenticated
    taken = events(conn, b"".join(OPERATIONS[name] for name in sorted(OPERATIONS)))
    assert taken == [link.decode_op(OPERATIONS[name][4:]) for name in sorted(OPERATIONS)]
