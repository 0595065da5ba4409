"""How many subjects an expiry tick looks at (app.expire_budget): every subject once per
CacheExpireTime / EXPIRE_SWEEPS, within EXPIRE_SUBJECTS_PER_TICK."""

from __future__ import annotations

import math

from migratory.server.app import (
    EXPIRE_SUBJECTS_PER_TICK,
    EXPIRE_SWEEPS,
    TICK_SECONDS,
    expire_budget,
)


def test_many_subjects_with_long_lived_messages_are_swept_slowly() -> None:
    # 10,000 subjects, messages kept 180 s: a sweep every 18 s, not twice a second
    assert expire_budget(10_000, 180) == 56
    assert expire_budget(0, 180) == 1
    assert expire_budget(3, 180) == 1


def test_short_lived_messages_and_huge_subject_counts_are_capped() -> None:
    assert expire_budget(20_000, 1) == EXPIRE_SUBJECTS_PER_TICK
    assert expire_budget(1_000_000, 180) == EXPIRE_SUBJECTS_PER_TICK


def test_every_subject_is_looked_at_within_a_tenth_of_the_expire_time() -> None:
    for subjects in (1, 999, 10_000, 123_457):
        for expire in (1, 7, 180, 3600):
            budget = expire_budget(subjects, expire)
            if budget < EXPIRE_SUBJECTS_PER_TICK:
                ticks = math.ceil(subjects / budget)
                assert ticks * TICK_SECONDS <= expire / EXPIRE_SWEEPS + TICK_SECONDS
