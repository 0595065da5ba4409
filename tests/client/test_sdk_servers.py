import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from migratory_client.servers import ServerEntry, choose_server, parse_server, parse_servers


def test_plain_url_gets_default_weight() -> None:
    assert parse_server("ws://a:8800") == ServerEntry("ws://a:8800", 100)


def test_weight_and_url() -> None:
    assert parse_server("  50   wss://b.example/x ") == ServerEntry("wss://b.example/x", 50)


@pytest.mark.parametrize(
    "entry",
    [
        "",
        "   ",
        "http://a:80",
        "a:8800",
        "-1 ws://a",
        "x ws://a",
        "1.5 ws://a",
        "10 ws://a extra",
        "ws://",
        "ws://a:99999",
        "ws://a:port",
        "\u00b2 ws://a",  # a digit to str.isdigit, not to int(): was "invalid literal"
        "ws://a:8800/#x",  # a WebSocket URL has no fragment (a browser throws at it)
        "ws://a#",
    ],
)
def test_bad_entry_is_named(entry: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_server(entry)
    assert repr(entry) in str(info.value)


def test_list_parsing() -> None:
    servers = parse_servers(["100 ws://a:8800", "50 ws://b:8800"])
    assert servers == (ServerEntry("ws://a:8800", 100), ServerEntry("ws://b:8800", 50))
    assert parse_servers("ws://a") == (ServerEntry("ws://a", 100),)


def test_empty_list_and_duplicates_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        parse_servers([])
    with pytest.raises(ValueError, match="twice"):
        parse_servers(["ws://a", "10 ws://a"])


@pytest.mark.parametrize(
    ("first", "second"),
    [("ws://a:8800", "ws://a:8800/"), ("ws://A:1", "ws://a:1"), ("ws://a", "ws://a:80"),
     ("wss://a", "wss://a:443/")],
)
def test_one_server_spelled_twice_is_refused(first: str, second: str) -> None:
    """Before: both kept, the server's share of connections doubled."""
    with pytest.raises(ValueError, match="listed twice") as info:
        parse_servers([first, f"50 {second}"])
    assert f"'50 {second}'" in str(info.value) and repr(first) in str(info.value)
    assert len(parse_servers(["ws://a:1", "ws://a:2", "ws://a:1/x", "wss://a:1"])) == 4


def test_all_weights_zero_choose_evenly() -> None:
    servers = parse_servers(["0 ws://a", "0 ws://b"])
    rng = random.Random(5)
    counts = Counter(choose_server(servers, rng).url for _ in range(2000))
    assert 900 < counts["ws://a"] < 1100


def test_weights_shape_the_choice() -> None:
    servers = parse_servers(["300 ws://a", "100 ws://b"])
    rng = random.Random(7)
    counts = Counter(choose_server(servers, rng).url for _ in range(4000))
    assert 2700 < counts["ws://a"] < 3300


def test_failed_server_is_avoided_when_another_exists() -> None:
    servers = parse_servers(["1000 ws://a", "1 ws://b"])
    rng = random.Random(1)
    assert all(choose_server(servers, rng, avoid=servers[0]).url == "ws://b" for _ in range(50))
    single = parse_servers(["ws://a"])
    assert choose_server(single, rng, avoid=single[0]) == single[0]


def test_zero_weight_only_when_nothing_else() -> None:
    servers = parse_servers(["0 ws://standby", "1 ws://a"])
    rng = random.Random(3)
    assert {choose_server(servers, rng).url for _ in range(200)} == {"ws://a"}
    assert choose_server(servers, rng, avoid=servers[1]).url == "ws://standby"


@given(
    weights=st.lists(st.integers(0, 1000), min_size=1, max_size=6),
    seed=st.integers(),
    avoid_index=st.none() | st.integers(0, 5),
)
def test_choice_is_always_a_listed_server(
    weights: list[int], seed: int, avoid_index: int | None
) -> None:
    servers = parse_servers([f"{w} ws://s{i}" for i, w in enumerate(weights)])
    avoid = servers[avoid_index] if avoid_index is not None and avoid_index < len(servers) else None
    chosen = choose_server(servers, random.Random(seed), avoid=avoid)
    assert chosen in servers
    if avoid is not None and len(servers) > 1:
        assert chosen != avoid
