"""Record ``recorded-524f73f.json``: what migratory 524f73f writes and takes.

Run with the Python of a 524f73f checkout, from that checkout (see make_fixture.py)::

    cd /tmp/old && .venv/bin/python /path/to/tests/cluster/upgrade_fixture/record_524f73f.py \\
        > /path/to/tests/cluster/upgrade_fixture/recorded-524f73f.json

Only the code of the running checkout is used, with fixed nonces: its cluster link's
handshake as each side writes it (acceptor nonces 1, 2, ...; connector 1000, ...) and
one frame of each operation a member sends (``test_cluster_upgrade_link.py`` plays them
against the link of today: a fake 524f73f peer), and the config keys it knows (it
refuses any other: ``tests/test_config_524f73f.py``).
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable

sys.path.insert(0, ".")

from cluster import link
from cluster.cache_sync import CacheSync, SubjectSync
from cluster.coordination import CommittedBatch, PublishRequest
from migratory import config
from migratory.model.message import Message, Qos

PASSWORD = "s3cret"
ACCEPTOR = "10.0.0.1:8801"
CONNECTOR = "10.0.0.2:8801"


def nonces(first: int) -> Callable[[int], bytes]:
    counter = itertools.count(first)
    return lambda size: next(counter).to_bytes(size, "big")


def handshake() -> dict[str, str]:
    acceptor = link.LinkConnection(role="accept", member=ACCEPTOR, password=PASSWORD,
                                   nonce_source=nonces(1))
    connector = link.LinkConnection(role="connect", member=CONNECTOR, password=PASSWORD,
                                    nonce_source=nonces(1000))
    connector.initiate()
    challenge = acceptor.initiate()
    connector.receive_data(challenge)
    (auth,) = [e.data for e in iter(connector.next_event, None) if isinstance(e, link.Outgoing)]
    acceptor.receive_data(auth)
    (welcome,) = [e.data for e in iter(acceptor.next_event, None) if isinstance(e, link.Outgoing)]
    connector.receive_data(welcome)
    assert isinstance(connector.next_event(), link.Authenticated)
    return {"challenge": challenge.hex(), "auth": auth.hex(), "welcome": welcome.hex()}


def message(seq: int = 0, **kw: object) -> Message:
    return Message("/Stocks/NYSE/IBM", b"price=101", {"currency": "USD"}, epoch=7 if seq else 0,
                   seq=seq, **kw)  # type: ignore[arg-type]


def operations() -> dict[str, str]:
    origin = "10.0.0.2:8801#5"
    request = PublishRequest(origin, 3, message(retained=True, qos=Qos.GUARANTEED,
                                                closure="c-3"))
    batch = CommittedBatch(12, (message(4),), ((origin, 3),))
    repeats = CommittedBatch(13, (message(5),), ((origin, 4),), ((origin, 3, 7, 4),))
    sync = CacheSync(13, (SubjectSync("/Stocks/NYSE/IBM", 7, 5, message(5, retained=True),
                                      (message(4), message(5))),))
    ops = {
        "forward": link.Forward((request,)),
        "forward_failed": link.ForwardFailed(((origin, 3),), "no Raft majority", True),
        "replicate": link.Replicate(12, full=True),
        "batch": link.Batch(batch),
        "batch_with_repeats": link.Batch(repeats),
        "sync_request": link.SyncRequest(12),
        "sync_refused": link.SyncRefused(11, "waiting for a sync"),
        "sync": link.Sync(sync),
        "standard_publish": link.StandardPublish(message(retained=True)),
        "heartbeat": link.Heartbeat(13, ready=False),
    }
    return {name: link.encode_frame(op).hex() for name, op in ops.items()}


if __name__ == "__main__":
    keys = sorted(setting.key for setting in config.SETTINGS)
    json.dump({"handshake": handshake(), "operations": operations(), "config_keys": keys},
              sys.stdout, indent=1)
    sys.stdout.write("\n")
