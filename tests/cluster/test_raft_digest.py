"""The coordinator digest is O(subjects): a seed spaces it out so that it takes at most
DIGEST_SHARE of the Raft thread (cluster/raft.py, ``next_digest_at``)."""

from __future__ import annotations

from cluster.coordination import GROUP_COUNT, Coordinator
from cluster.raft import DIGEST_PERIOD, DIGEST_SHARE, next_digest_at


def test_a_cheap_digest_is_computed_every_period() -> None:
    assert next_digest_at(100.0, 0.0001) == 100.0 + DIGEST_PERIOD


def test_an_expensive_digest_takes_at_most_its_share_of_the_raft_thread() -> None:
    # 0.4 s: what one digest of 1,000,000 subjects cost (it ran every second: 40 %)
    took = 0.4
    period = next_digest_at(100.0, took) - 100.0
    assert took / period <= DIGEST_SHARE
    assert period >= 40.0


def test_the_digest_changes_with_any_subjects_seq() -> None:
    a, b = Coordinator(), Coordinator()
    for c in (a, b):
        c.group_epochs = {g: 7 for g in range(GROUP_COUNT)}
        c.seqs = {f"/s/{i}": 1 for i in range(100)}
    assert a.digest() == b.digest()
    b.seqs["/s/50"] = 2
    assert a.digest() != b.digest()
