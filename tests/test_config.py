"""The one validated config object: defaults, file, environment, --set."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from migratory.config import (
    SETTINGS,
    Config,
    ConfigError,
    env_overrides,
    load_config,
    parse_set_options,
    reference_markdown,
)
from migratory.config_values import Setting


def test_defaults_are_a_working_single_node_config() -> None:
    config = Config.defaults()
    assert config.listen == (("127.0.0.1", 8800),)
    assert config.max_cached_messages_per_subject == 1000
    assert config.cache_expire_time == 180
    assert config.publish_snapshot_message is True
    assert config.entitlement == "None"


def test_file_in_seed_style(tmp_path: Path) -> None:
    path = tmp_path / "migratory.conf"
    path.write_text(
        "# comment\n\nPublishSnapshotMessage = false\nBatchTime = 5\n"
        "Listen = 127.0.0.1:9000, [::1]:9001\n"
    )
    config = load_config(path, environ={})
    assert config.publish_snapshot_message is False
    assert config.batch_time == 5
    assert config.listen == (("127.0.0.1", 9000), ("::1", 9001))


def test_unknown_key_names_the_key_line_and_a_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"f\.conf:2: unknown key 'BatchTmie' .*'BatchTime'"):
        load_config("f.conf", text="BatchTime = 1\nBatchTmie = 2\n", environ={})


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("BatchTime", "soon", "BatchTime: expected a whole number of milliseconds"),
        ("BatchTime", "-1", "BatchTime: must be >= 0"),
        ("PublishSnapshotMessage", "maybe", "PublishSnapshotMessage: expected true or false"),
        ("Listen", "localhost", "Listen: expected host:port"),
        ("Listen", "127.0.0.1:70000", "Listen: must be >= 0 and <= 65535"),
        # int() reads any script's digits: a fullwidth 8800 was taken as port 8800
        ("Listen", "127.0.0.1:\uff18\uff18\uff10\uff10", "Listen: expected a whole number"),
        ("BatchTime", "\u0665", "BatchTime: expected a whole number of milliseconds"),
        ("Entitlement", "Kerberos", "Entitlement: expected one of None, Basic, Token, Custom"),
    ],
)
def test_bad_values_name_the_key(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(overrides={key: value}, environ={})


def test_cross_key_rules() -> None:
    with pytest.raises(ConfigError, match="needs EntitlementAllowToken"):
        load_config(overrides={"Entitlement": "Basic"}, environ={})
    with pytest.raises(ConfigError, match="MaxFrameSize"):
        load_config(overrides={"MaxFrameSize": "2048", "MaxMessageSize": "4096"}, environ={})


def test_a_client_may_have_the_largest_message_waiting() -> None:
    """A message larger than ClientMaxPendingBytes cut off every client it was delivered
    to, and each again at every resume (an SSE stream, an MQTT session: for ever)."""
    with pytest.raises(ConfigError) as refused:
        load_config(overrides={"ClientMaxPendingBytes": "65536"}, environ={})
    message = str(refused.value)
    assert "ClientMaxPendingBytes (from --set) (65536) must be at least 2 x" in message
    assert "MaxMessageSize" in message
    assert "(131072)" in message
    load_config(overrides={"ClientMaxPendingBytes": "262144"}, environ={})
    load_config(overrides={"ClientMaxPendingBytes": "65536", "MaxMessageSize": "32768"},
                environ={})


def test_max_message_size_is_at_most_what_an_mqtt_publish_carries() -> None:
    """A message past 256 MiB less 3 bytes cannot be an MQTT PUBLISH (its remaining
    length is at most 268,435,455: the content, the topic and its length, a packet id):
    taken, it was numbered and its MQTT encoding raised in the hub after the position was
    taken. MaxMessageSize is bounded there, the refusal naming the key."""
    big = {"MaxFrameSize": str(1 << 30), "ClientMaxPendingBytes": str(1 << 30)}
    with pytest.raises(ConfigError, match=r"MaxMessageSize.*<= 268435452"):
        load_config(overrides={**big, "MaxMessageSize": "268435453"}, environ={})
    load_config(overrides={**big, "MaxMessageSize": "268435452"}, environ={})


def test_precedence_file_then_environment_then_set(tmp_path: Path) -> None:
    path = tmp_path / "c.conf"
    path.write_text("BatchTime = 1\nMaxBatchingSpace = 100\nServerName = file\n")
    environ = {"MIGRATORY_CFG_BATCHTIME": "2", "MIGRATORY_CFG_servername": "env", "PATH": "/x"}
    config = load_config(path, overrides={"BatchTime": "3"}, environ=environ)
    assert (config.batch_time, config.server_name, config.max_batching_space) == (3, "env", 100)


def test_unknown_environment_key_is_refused_but_other_variables_are_ignored() -> None:
    assert env_overrides({"MIGRATORY_SERVICE_HOST": "10.0.0.1"}).values == {}
    with pytest.raises(ConfigError, match="MIGRATORY_CFG_NOPE"):
        env_overrides({"MIGRATORY_CFG_NOPE": "1"})


def test_set_option_syntax() -> None:
    assert parse_set_options(["BatchTime=0"]) == {"BatchTime": "0"}
    with pytest.raises(ConfigError, match="expected Key=Value"):
        parse_set_options(["BatchTime"])


def test_as_text_round_trips() -> None:
    config = load_config(overrides={"Listen": "127.0.0.1:1, 127.0.0.2:2"}, environ={})
    assert Config.from_mapping(config.as_text()) == config


def test_docs_config_reference_matches_the_code() -> None:
    doc = Path(__file__).parent.parent / "docs" / "config.md"
    assert doc.read_text() == reference_markdown(), "regenerate: python -m migratory.config"


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda setting: setting.key)
def test_the_reference_says_the_unit_of_each_number_of_seconds_milliseconds_or_bytes(
    setting: Setting,
) -> None:
    """The unit is the parser's (its refusal says 'a whole number of milliseconds').
    Before: EntitlementPluginTimeout (500), ClientHeartbeatMinimum (1000),
    ClusterElectionTimeout (150), EncryptedBatchTime, ClusterSeedLinkWait (35),
    MaxMessageSize, MaxFrameSize and AuditLogMaxBytes said 'how long', 'this long' or
    'this size' without a unit."""
    try:
        setting.parse("?")
    except ValueError as refused:
        unit = re.search(r"a whole number of (seconds|milliseconds|bytes)\b", str(refused))
    else:
        unit = None
    if unit is not None:
        assert re.search(rf"\b{unit[1]}\b", setting.doc, re.I), (setting.key, unit[1])


def test_serve_refuses_a_bad_config_with_a_message_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.conf"
    path.write_text("Listen = 127.0.0.1:0\nMaxCachedMessagesPerSubjet = 10\n")
    result = subprocess.run(
        [sys.executable, "-m", "cluster", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "unknown key 'MaxCachedMessagesPerSubjet'" in result.stderr
    assert "did you mean 'MaxCachedMessagesPerSubject'" in result.stderr
    assert "Traceback" not in result.stderr


MEMBERS = "127.0.0.1:9100, 127.0.0.1:9110, 127.0.0.1:9120, 127.0.0.1:9130"


def test_cross_key_rules_run_once_on_all_sources_merged(tmp_path: Path) -> None:
    """The file names the members, the environment says which one this is, --set the
    password: each source alone would be refused, together they are a member."""
    path = tmp_path / "c.conf"
    path.write_text(
        f"ClusterMembers = {MEMBERS}\nClusterDeliveryMode = Guaranteed\n"
        "ClusterDataDir = /var/lib/migratory\n"
    )
    environ = {"MIGRATORY_CFG_CLUSTERMEMBERLISTEN": "127.0.0.1:9120"}
    config = load_config(path, overrides={"ClusterPassword": "pw"}, environ=environ)
    assert config.member_index == 2
    with pytest.raises(ConfigError, match=r"ClusterPassword is required"):
        load_config(path, environ=environ)


def test_cross_key_errors_name_where_each_key_came_from(tmp_path: Path) -> None:
    path = tmp_path / "c.conf"
    path.write_text(f"ClusterMembers = {MEMBERS}\n")
    environ = {"MIGRATORY_CFG_CLUSTERMEMBERLISTEN": "127.0.0.1:1"}
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ=environ)
    message = str(caught.value)
    assert ("ClusterMemberListen (from environment variable MIGRATORY_CFG_CLUSTERMEMBERLISTEN)"
            " 127.0.0.1:1") in message
    assert f"ClusterMembers (from {path}:1)" in message


def test_listener_roles_map_each_listener_to_its_protocols_and_publishing() -> None:
    from migratory.listeners import client_listeners

    config = Config.from_mapping({
        "Listen": "0.0.0.0:80, 192.168.1.1:8801",
        "ListenerRoles": "0.0.0.0:80 subscribe; 192.168.1.1:8801 publish native,http,mqtt",
    })
    public, lan = client_listeners(config)
    assert (public.publish, public.protocols) == (False, frozenset({"native", "http", "mqtt"}))
    assert (lan.publish, lan.protocols) == (True, frozenset({"native", "http", "mqtt"}))
    assert Config.from_mapping(config.as_text()) == config


@pytest.mark.parametrize(
    ("roles", "message"),
    [
        ("127.0.0.1:9999 publish", "127.0.0.1:9999 is not in Listen, ListenEncrypted"),
        ("127.0.0.1:8800 everything", "expected publish or subscribe"),
        ("127.0.0.1:8800 publish smtp", "unknown protocol 'smtp'"),
        ("127.0.0.1:8800", "expected 'host:port publish|subscribe"),
        ("127.0.0.1:8800 publish; 127.0.0.1:8800 subscribe", "named twice"),
    ],
)
def test_bad_listener_roles_are_refused(roles: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config.from_mapping({"ListenerRoles": roles})


def test_cors_origins_and_heartbeat() -> None:
    config = Config.from_mapping({"HttpCorsOrigins": "https://a.example, http://b.example:8080",
                                  "SseHeartbeatInterval": "5"})
    assert config.http_cors_origins == ("https://a.example", "http://b.example:8080")
    assert config.sse_heartbeat_interval == 5
    for bad, message in [("a.example", "expected \\* or origins"),
                         ("*, https://a", "'\\*' allows every origin")]:
        with pytest.raises(ConfigError, match=f"HttpCorsOrigins: {message}"):
            Config.from_mapping({"HttpCorsOrigins": bad})
    with pytest.raises(ConfigError, match="SseHeartbeatInterval: must be >= 1"):
        Config.from_mapping({"SseHeartbeatInterval": "0"})


def test_a_file_with_a_byte_order_mark_reads_as_utf8(tmp_path: Path) -> None:
    path = tmp_path / "bom.conf"  # Notepad and some editors start UTF-8 files with a BOM
    path.write_bytes(b"\xef\xbb\xbfListen = 127.0.0.1:9100\nServerName = caf\xc3\xa9\n")
    config = load_config(path, environ={})
    assert config.listen == (("127.0.0.1", 9100),)
    assert config.server_name == "café"


def test_a_file_not_in_utf8_is_refused_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.conf"
    path.write_bytes(b"Listen = 127.0.0.1:9100\nServerName = caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin1.conf:2: not UTF-8 \(byte 0xe9\)"):
        load_config(path, environ={})


def test_a_range_error_names_the_unit() -> None:
    with pytest.raises(ConfigError, match=r"BatchTime: must be >= 0 and <= 10000 "
                                          r"\(milliseconds\), got -5"):
        load_config(overrides={"BatchTime": "-5"}, environ={})


def _whole_number_keys() -> list[str]:
    from migratory.config import SETTINGS

    keys = []
    for setting in SETTINGS:
        try:
            value = setting.parse(setting.default)
        except ValueError:
            continue  # (a default that needs other keys: not a plain number)
        if isinstance(value, int) and not isinstance(value, bool):
            keys.append(setting.key)
    return keys


@pytest.mark.parametrize("key", _whole_number_keys())
def test_an_absurd_or_negative_limit_is_refused_naming_the_key(key: str) -> None:
    """Every whole-number key has an upper bound: 10^21 was taken by 28 of them
    (MaxFrameSize, ClientMaxPendingBytes, IncompleteFrameBudget, MaxPendingHandshakes,
    MaxSubscriptionsPerConnection, HandshakeTimeout...) -- a limit turned off by a digit
    too many, which no key documents. Refused now, as a negative number always was,
    with a message naming the key."""
    for absurd in ("1000000000000000000000", "-1"):
        with pytest.raises(ConfigError, match=key):
            Config.from_mapping({key: absurd})
