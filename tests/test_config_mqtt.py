"""ListenMqtt: parsed, checked against Listen, documented."""

from __future__ import annotations

from pathlib import Path

import pytest

from migratory.config import Config, ConfigError


def test_listen_mqtt_defaults_to_none_and_parses_addresses() -> None:
    assert Config.defaults().listen_mqtt == ()
    config = Config.from_mapping({"ListenMqtt": "127.0.0.1:1883, [::1]:1884"})
    assert config.listen_mqtt == (("127.0.0.1", 1883), ("::1", 1884))
    assert config.as_text()["ListenMqtt"] == "127.0.0.1:1883, ::1:1884"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"ListenMqtt": "127.0.0.1"}, "ListenMqtt"),
        ({"ListenMqtt": "127.0.0.1:99999"}, "ListenMqtt"),
        ({"ListenMqtt": "127.0.0.1:8800", "Listen": "127.0.0.1:8800"}, "both name 127.0.0.1:8800"),
        # before: accepted, then exit 1 'cannot listen ... Address already in use'
        ({"ListenMqtt": "127.0.0.1:1883, 127.0.0.1:1883"}, "names 127.0.0.1:1883 twice"),
        ({"Listen": "127.0.0.1:8800,127.0.0.1:8800"}, "names 127.0.0.1:8800 twice"),
        ({"ListenMQTT": "127.0.0.1:1883"}, "unknown key 'ListenMQTT'"),
    ],
)
def test_bad_listen_mqtt_is_refused_naming_the_key(settings: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config.from_mapping(settings)


def test_listen_mqtt_is_in_the_reference() -> None:
    text = (Path(__file__).parent.parent / "docs" / "config.md").read_text()
    assert "| `ListenMqtt` |" in text


def test_mqtt_session_expiry_defaults_to_seven_days_and_zero_is_never() -> None:
    assert Config.defaults().mqtt_session_expiry == 604800
    assert Config.from_mapping({"MqttSessionExpiry": "0"}).mqtt_session_expiry == 0
    with pytest.raises(ConfigError, match="MqttSessionExpiry"):
        Config.from_mapping({"MqttSessionExpiry": "-1"})
    text = (Path(__file__).parent.parent / "docs" / "config.md").read_text()
    assert "| `MqttSessionExpiry` |" in text


def test_mqtt_max_sessions_defaults_to_no_cap() -> None:
    assert Config.defaults().mqtt_max_sessions == 0
    assert Config.from_mapping({"MqttMaxSessions": "5000"}).mqtt_max_sessions == 5000
    with pytest.raises(ConfigError, match="MqttMaxSessions"):
        Config.from_mapping({"MqttMaxSessions": "-1"})
    text = (Path(__file__).parent.parent / "docs" / "config.md").read_text()
    assert "| `MqttMaxSessions` |" in text


def test_mqtt_session_max_subjects_defaults_to_ten_thousand_within_bounds() -> None:
    assert Config.defaults().mqtt_session_max_subjects == 10_000
    config = Config.from_mapping({"MqttSessionMaxSubjects": "50_000"})
    assert config.mqtt_session_max_subjects == 50_000
    for bad in ("999", "1000001", "0", "many"):
        with pytest.raises(ConfigError, match="MqttSessionMaxSubjects"):
            Config.from_mapping({"MqttSessionMaxSubjects": bad})
    text = (Path(__file__).parent.parent / "docs" / "config.md").read_text()
    assert "| `MqttSessionMaxSubjects` |" in text


CLUSTER = {
    "ClusterMembers": "127.0.0.1:9100, 127.0.0.1:9110, 127.0.0.1:9120",
    "ClusterMemberListen": "127.0.0.1:9100",
    "ClusterPassword": "a-long-enough-cluster-password",
}


def test_in_a_cluster_mqtt_session_expiry_is_zero_or_long_enough_for_the_sweep() -> None:
    """A member saves its own clients' records again when its expiry sweep comes by
    (every subject once a minute): a shorter expiry let another member discard the
    session of a client connected to it (benchmarks/soak.py --cluster at 2 s)."""
    from migratory.config_mqtt import CLUSTER_MIN_SESSION_EXPIRY, SESSION_SWEEP_SECONDS

    assert CLUSTER_MIN_SESSION_EXPIRY > 2 * SESSION_SWEEP_SECONDS
    with pytest.raises(ConfigError, match=r"MqttSessionExpiry.* = 60: in a cluster it is 0"):
        Config.from_mapping({**CLUSTER, "MqttSessionExpiry": "60"})
    for fine in ("0", str(CLUSTER_MIN_SESSION_EXPIRY)):
        config = Config.from_mapping({**CLUSTER, "MqttSessionExpiry": fine})
        assert config.mqtt_session_expiry == int(fine)
    assert Config.from_mapping({"MqttSessionExpiry": "2"}).mqtt_session_expiry == 2  # alone
