"""Config keys of the cluster (migratory/config_cluster.py): member list or template,
this member, seeds, delivery mode, password and data directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from migratory.config import Config, ConfigError, load_config

CLUSTER = {
    "ClusterMembers": "127.0.0.1:9100, 127.0.0.1:9110, 127.0.0.1:9120, 127.0.0.1:9130",
    "ClusterMemberListen": "127.0.0.1:9110",
    "ClusterPassword": "s3cret-s3cret",
    "ClusterDeliveryMode": "Guaranteed",
    "ClusterDataDir": "/var/lib/migratory",
}


def test_cluster_config_roles() -> None:
    config = load_config(overrides=CLUSTER, environ={})
    assert config.clustered and config.is_seed and config.member_index == 1
    assert config.cluster_seed_member_count == 3  # automatic for 3-4 members
    assert config.seed_members == config.cluster_members[:3]
    last = load_config(overrides={**CLUSTER, "ClusterMemberListen": "127.0.0.1:9130"}, environ={})
    assert not last.is_seed
    five = ", ".join(f"127.0.0.1:{9100 + 10 * i}" for i in range(6))
    assert load_config(
        overrides={**CLUSTER, "ClusterMembers": five}, environ={}
    ).cluster_seed_member_count == 5


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"ClusterSeedMemberCount": "4"}, "ClusterSeedMemberCount: must be 3 or 5"),
        ({"ClusterMemberListen": "127.0.0.1:9999"}, "not one of ClusterMembers"),
        ({"ClusterMemberListen": ""}, "ClusterMemberListen must name this member"),
        ({"ClusterPassword": ""}, "ClusterPassword is required"),
        ({"ClusterDataDir": ""}, "Guaranteed needs ClusterDataDir"),
        (
            {"ClusterMembers": "127.0.0.1:9100, 127.0.0.1:9110", "ClusterSeedMemberCount": ""},
            "Guaranteed needs at least 3 members",
        ),
        ({"ClusterSeedMemberCount": "5"}, r"= 5 but ClusterMembers \(from --set\) has only 4"),
        ({"ClusterMembers": "127.0.0.1:9110, 127.0.0.1:9110, 127.0.0.1:9100"}, "more than once"),
    ],
)
def test_bad_cluster_config_is_refused_with_a_clear_message(
    changes: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(overrides={**CLUSTER, **changes}, environ={})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"Listen": "127.0.0.1:9110"}, r"Listen \(from --set\) and the cluster link of "
                                       r"ClusterMemberListen \(from --set\) both name"),
        ({"ListenMqtt": "127.0.0.1:9111"}, r"and the Raft port \(the cluster port \+ 1\) of "
                                           r"ClusterMemberListen \(from --set\) both name"),
        ({"ListenMqtt": "127.0.0.1:9201", "ClusterMemberBind": "127.0.0.1:9200"},
         "the Raft port .* of ClusterMemberBind"),
    ],
)
def test_a_client_listener_on_the_members_cluster_ports_is_refused_naming_both(
    changes: dict[str, str], message: str
) -> None:
    """Before: accepted, and the second bind failed at start-up -- exit 1, 'cluster link
    127.0.0.1:9110: Address already in use (ClusterMemberBind / ClusterMemberListen:
    another member with this address on this host?)' -- or, for the Raft port, later."""
    with pytest.raises(ConfigError, match=message):
        load_config(overrides={**CLUSTER, **changes}, environ={})


def test_a_standard_member_or_a_non_seed_has_no_raft_port_to_clash_with() -> None:
    standard = {**CLUSTER, "ClusterDeliveryMode": "Standard", "ListenMqtt": "127.0.0.1:9111"}
    assert load_config(overrides=standard, environ={}).listen_mqtt == (("127.0.0.1", 9111),)
    non_seed = {**CLUSTER, "ClusterMemberListen": "127.0.0.1:9130", "Listen": "127.0.0.1:9131"}
    assert load_config(overrides=non_seed, environ={}).listen == (("127.0.0.1", 9131),)


def test_guaranteed_without_members_is_refused() -> None:
    with pytest.raises(ConfigError, match="Guaranteed needs ClusterMembers"):
        load_config(overrides={"ClusterDeliveryMode": "Guaranteed"}, environ={})


def test_serve_with_an_unusable_cluster_data_dir_says_so(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    settings = {
        **CLUSTER,
        "ClusterMembers": "127.0.0.1:0, 127.0.0.1:1, 127.0.0.1:2",
        "ClusterMemberListen": "127.0.0.1:0",
        "ClusterDataDir": str(blocker / "raft"),
        "Listen": "127.0.0.1:0",
    }
    args = [sys.executable, "-m", "cluster", "serve"]
    for key, value in settings.items():
        args += ["--set", f"{key}={value}"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert f"ClusterDataDir {blocker / 'raft'}: Not a directory" in result.stderr
    assert "Traceback" not in result.stderr


def test_member_template_expands_to_the_ordered_member_list() -> None:
    settings = {
        **CLUSTER,
        "ClusterMembers": "",
        "ClusterMemberTemplate": "m-{ordinal}.members:9800",
        "ClusterMemberCount": "6",
        "ClusterMemberListen": "m-5.members:9800",
    }
    config = load_config(overrides=settings, environ={})
    assert config.cluster_members == tuple((f"m-{i}.members", 9800) for i in range(6))
    assert config.member_index == 5 and not config.is_seed
    assert config.cluster_seed_member_count == 5
    assert Config.from_mapping(config.as_text()) == config


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"ClusterMemberTemplate": "m.members:9800"}, r"Template: expected \{ordinal\}"),
        ({"ClusterMemberTemplate": "m-{ordinal}"}, "ClusterMemberTemplate: expected host:port"),
        ({"ClusterMemberCount": ""}, "ClusterMemberCount is required"),
        ({"ClusterMemberTemplate": ""}, "ClusterMemberCount .* is set but ClusterMemberTemplate"),
        ({"ClusterMembers": "127.0.0.1:1"}, "either ClusterMembers .* or ClusterMemberTemplate"),
        ({"ClusterMemberCount": "2"}, r"at least 3 members, ClusterMembers \(ClusterMemberTemp"),
        # Before: any count up to 2^40 was taken and expanded (and each address counted
        # against the list: quadratic), 10,000 members 3.4 s, 100,000 over a minute, a
        # typo's 100000000 until memory ran out, before the server listened or said a word
        ({"ClusterMemberCount": "1001"}, r"ClusterMemberCount: must be >= 1 and <= 1000"),
        ({"ClusterMemberCount": "100000000"}, r"ClusterMemberCount: must be >= 1 and <= 1000"),
    ],
)
def test_bad_member_template_is_refused(changes: dict[str, str], message: str) -> None:
    settings = {
        **CLUSTER,
        "ClusterMembers": "",
        "ClusterMemberTemplate": "m-{ordinal}.members:9800",
        "ClusterMemberCount": "4",
        "ClusterMemberListen": "m-1.members:9800",
        **changes,
    }
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=settings, environ={})


def test_a_member_list_past_the_bound_is_refused_naming_the_key() -> None:
    """Before: taken, and its duplicates looked for in quadratic time."""
    listed = ", ".join(f"10.0.{i // 250}.{i % 250}:9800" for i in range(1001))
    settings = {**CLUSTER, "ClusterMembers": listed, "ClusterMemberListen": "10.0.0.0:9800"}
    with pytest.raises(ConfigError, match=r"ClusterMembers .*lists 1,001 members: at most 1,000"):
        load_config(overrides=settings, environ={})
    settings["ClusterMembers"] = listed.rsplit(", ", 1)[0]  # 1,000: the bound itself
    assert len(load_config(overrides=settings, environ={}).cluster_members) == 1000


def test_member_ordinal_gives_the_listen_address_from_the_template() -> None:
    """One source for a member's address: the template, for its ordinal (a StatefulSet
    pod's pod-index label) -- not a second spelling of it kept equal by hand."""
    settings = {
        **CLUSTER,
        "ClusterMembers": "",
        "ClusterMemberTemplate": "m-{ordinal}.members:9800",
        "ClusterMemberCount": "6",
        "ClusterMemberListen": "",
        "ClusterMemberOrdinal": "5",
    }
    config = load_config(overrides=settings, environ={})
    assert config.cluster_member_listen == ("m-5.members", 9800)
    assert config.member_index == 5 and not config.is_seed
    assert config.as_text()["ClusterMemberListen"] == ""  # derived, as ClusterMembers
    assert Config.from_mapping(config.as_text()) == config


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"ClusterMemberListen": "m-1.members:9800"},
         r"ClusterMemberListen \(from --set\) = m-1.members:9800 and "
         r"ClusterMemberOrdinal \(from --set\) = 1 are both set"),
        ({"ClusterMemberOrdinal": "4"},
         r"ClusterMemberOrdinal \(from --set\) = 4 is past the member list: "
         r"ClusterMemberCount \(from --set\) = 4 lists ordinals 0 \.\. 3"),
        ({"ClusterMemberOrdinal": "-1"}, "ClusterMemberOrdinal: must be >= 0"),
        ({"ClusterMemberTemplate": "", "ClusterMemberCount": "", "ClusterMembers": "a:1,b:2,c:3"},
         r"ClusterMemberOrdinal \(from --set\) is set but ClusterMemberTemplate is empty"),
        ({"ClusterMemberOrdinal": ""}, "ClusterMemberListen must name this member .or, with a "
         "ClusterMemberTemplate, ClusterMemberOrdinal."),
    ],
)
def test_bad_member_ordinal_is_refused_naming_both_keys(
    changes: dict[str, str], message: str
) -> None:
    settings = {
        **CLUSTER,
        "ClusterMembers": "",
        "ClusterMemberTemplate": "m-{ordinal}.members:9800",
        "ClusterMemberCount": "4",
        "ClusterMemberListen": "",
        "ClusterMemberOrdinal": "1",
        **changes,
    }
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=settings, environ={})


def test_the_election_timeout_is_taken_in_milliseconds() -> None:
    assert load_config(overrides=CLUSTER, environ={}).cluster_election_timeout == 150
    config = load_config(overrides={**CLUSTER, "ClusterElectionTimeout": "600"}, environ={})
    assert config.cluster_election_timeout == 600
    for edge in ("100", "5000"):
        assert load_config(overrides={**CLUSTER, "ClusterElectionTimeout": edge},
                           environ={}).cluster_election_timeout == int(edge)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("99", r"ClusterElectionTimeout.*must be >= 100 and <= 5000 \(milliseconds\), got 99"),
        ("5001", r"ClusterElectionTimeout.*must be >= 100 and <= 5000 \(milliseconds\), got 5001"),
        ("0.3", r"ClusterElectionTimeout.*expected a whole number of milliseconds, got '0.3'"),
        ("150ms", r"ClusterElectionTimeout.*expected a whole number of milliseconds"),
        ("", r"ClusterElectionTimeout.*expected a whole number of milliseconds"),
    ],
)
def test_a_bad_election_timeout_is_refused_naming_the_key(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(overrides={**CLUSTER, "ClusterElectionTimeout": value}, environ={})


def test_a_misspelt_election_timeout_is_an_unknown_key(tmp_path: Path) -> None:
    path = tmp_path / "f.conf"
    path.write_text("ClusterElectionTimeoutMs = 400\n")
    with pytest.raises(ConfigError, match=r"unknown key 'ClusterElectionTimeoutMs' "
                                          r"\(did you mean 'ClusterElectionTimeout'"):
        load_config(path, environ={})
