"""The coordinator digest the Raft thread computes: it reads no subject's seq (each one's
is summed into it as it is numbered), and a seed spaces it out so that it takes at most
DIGEST_SHARE of the Raft thread (cluster/raft.py, ``next_digest_at``)."""

from __future__ import annotations

import pickle
from typing import Any

from cluster.coordination import Coordinator, PublishRequest
from cluster.raft import DIGEST_PERIOD, DIGEST_SHARE, next_digest_at
from migratory.model.message import Message


def test_a_cheap_digest_is_computed_every_period() -> None:
    assert next_digest_at(100.0, 0.0001) == 100.0 + DIGEST_PERIOD


def test_an_expensive_digest_takes_at_most_its_share_of_the_raft_thread() -> None:
    # 0.4 s: what one digest of 1,000,000 subjects cost (it ran every second: 40 %)
    took = 0.4
    period = next_digest_at(100.0, took) - 100.0
    assert took / period <= DIGEST_SHARE
    assert period >= 40.0


def numbered(*batches: list[str]) -> Coordinator:
    coordinator = Coordinator()
    for b, subjects in enumerate(batches):
        coordinator.apply_batch(7, [PublishRequest("o", 1000 * b + i, Message(s, b"x"))
                                    for i, s in enumerate(subjects)])
    return coordinator


def test_the_digest_changes_with_any_subjects_seq() -> None:
    subjects = [f"/s/{i}" for i in range(100)]
    a, b = numbered(subjects, ["/s/50"]), numbered(subjects, ["/s/51"])
    assert numbered(subjects, ["/s/50"]).digest() == a.digest()
    assert a.clsn == b.clsn and len(a.seqs) == len(b.seqs)
    assert a.digest() != b.digest()  # one subject at seq 2, not another


class Unread(dict[str, int]):
    """Seqs the digest must not read (a million subjects' were 0.45 s of the Raft thread)."""

    def items(self) -> Any:
        raise AssertionError("the digest read every subject's seq")

    def __iter__(self) -> Any:
        raise AssertionError("the digest read every subject's seq")


def test_the_digest_reads_no_subject() -> None:
    coordinator = numbered([f"/s/{i}" for i in range(1000)])
    expected = coordinator.digest()
    coordinator.seqs = Unread(coordinator.seqs)
    assert coordinator.digest() == expected  # before: AssertionError (sorted(seqs.items()))


def test_the_digest_survives_a_dump_and_a_state() -> None:
    coordinator = numbered([f"/s/{i}" for i in range(300)], ["/s/7", "/s/8"])
    loaded = pickle.loads(pickle.dumps(coordinator))
    assert loaded.digest() == coordinator.digest()
    assert Coordinator.from_state(coordinator.to_state()).digest() == coordinator.digest()
    old = Coordinator.__new__(Coordinator)  # a dump of the code before: its attributes
    old.__setstate__({k: v for k, v in vars(coordinator).items() if not k.startswith("_")})
    assert old.digest() == coordinator.digest()
