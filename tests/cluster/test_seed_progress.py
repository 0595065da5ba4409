"""cluster/seed_progress.py: which seeds the Raft leader names as applying nothing."""

from __future__ import annotations

from cluster.seed_progress import REPEAT, STUCK_SECONDS, SeedProgress

SEED = "10.0.0.1:9800"


def test_a_seed_that_stands_behind_the_leader_is_named_once_then_every_repeat() -> None:
    progress = SeedProgress()
    said = [progress.observe(SEED, 7, 100 + int(t), float(t)) for t in range(0, 400, 10)]
    named = [(t * 10, s) for t, s in enumerate(said) if s is not None]
    assert [t for t, _ in named] == [int(STUCK_SECONDS), int(STUCK_SECONDS + REPEAT)]
    assert named[0][1].startswith(f"seed {SEED} applies nothing: it has stood at clsn 7 "
                                  "for 30 s while this Raft leader applied up to 130")
    assert progress.stuck() == {SEED: 7}


def test_a_seed_that_moves_or_stands_with_the_leader_is_not_named() -> None:
    progress = SeedProgress()
    for t in range(0, 300, 10):  # catching up, slowly: it moves
        assert progress.observe(SEED, t // 10, 1000, float(t)) is None
    for t in range(300, 600, 10):  # a quiet cluster: nothing more to apply
        assert progress.observe(SEED, 1000, 1000, float(t)) is None
    assert progress.stuck() == {}


def test_a_seed_that_moves_again_or_cannot_be_asked_starts_over() -> None:
    progress = SeedProgress(stuck_seconds=10)
    assert progress.observe(SEED, 5, 9, 0.0) is None
    assert progress.observe(SEED, 5, 9, 10.0) is not None
    assert progress.observe(SEED, 6, 9, 11.0) is None  # it moved
    assert progress.stuck() == {}
    progress.forget(SEED)
    assert progress.observe(SEED, 6, 9, 12.0) is None and progress.stuck() == {}
