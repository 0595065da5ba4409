import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from migratory_client.backoff import Backoff, ReconnectPolicy
from migratory_client.session import Keepalive


def test_exponential_without_jitter() -> None:
    backoff = Backoff(ReconnectPolicy(initial_delay=1, max_delay=10, jitter=0), random.Random(0))
    assert [backoff.next_delay() for _ in range(6)] == [1, 2, 4, 8, 10, 10]


def test_reset_after_a_good_session() -> None:
    backoff = Backoff(ReconnectPolicy(initial_delay=1, max_delay=10, jitter=0), random.Random(0))
    for _ in range(4):
        backoff.next_delay()
    backoff.reset()
    assert backoff.failures == 0
    assert backoff.next_delay() == 1


def test_max_attempts() -> None:
    backoff = Backoff(ReconnectPolicy(max_attempts=2), random.Random(0))
    backoff.next_delay()
    assert not backoff.exhausted()
    backoff.next_delay()
    assert backoff.exhausted()
    assert not Backoff(ReconnectPolicy(), random.Random(0)).exhausted()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_delay": 0},
        {"initial_delay": 5, "max_delay": 1},
        {"multiplier": 0.5},
        {"jitter": 1.5},
        {"max_attempts": 0},
        {"connect_timeout": 0},
        {"healthy_after": 0},
        {"healthy_after": float("nan")},
        {"connect_timeout": float("nan")},  # before: accepted, then ValueError out of
        {"multiplier": float("nan")},  # the client's task on its first attempt
    ],
)
def test_policy_validation(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ReconnectPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs", [{"interval": float("nan")}, {"timeout": float("nan")}])
def test_keepalive_refuses_nan(kwargs: dict[str, float]) -> None:
    """Before: accepted, and the client's first session raised ValueError from trio."""
    with pytest.raises(ValueError, match="interval and timeout"):
        Keepalive(**kwargs)


@given(
    initial=st.floats(0.001, 5),
    span=st.floats(1, 100),
    multiplier=st.floats(1, 4),
    jitter=st.floats(0, 1),
    seed=st.integers(),
    steps=st.integers(1, 60),
)
def test_delays_are_bounded_and_jittered_downwards(
    initial: float, span: float, multiplier: float, jitter: float, seed: int, steps: int
) -> None:
    policy = ReconnectPolicy(
        initial_delay=initial, max_delay=initial * span, multiplier=multiplier, jitter=jitter
    )
    backoff = Backoff(policy, random.Random(seed))
    base = initial
    for _ in range(steps):
        delay = backoff.next_delay()
        assert base * (1 - jitter) - 1e-9 <= delay <= base + 1e-9
        assert delay <= policy.max_delay + 1e-9
        base = min(policy.max_delay, base * multiplier)
    assert backoff.failures == steps
