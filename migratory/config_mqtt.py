"""Config keys of persistent MQTT sessions: MqttSessionExpiry, MqttMaxSessions
(docs/mqtt.md, "Session expiry" and "Session cap")."""

from __future__ import annotations

from migratory.config_values import Setting, _int

MQTT_SESSION_SETTINGS: tuple[Setting, ...] = (
    Setting("MqttSessionExpiry", "mqtt_session_expiry", _int(0, unit=" of seconds"), "604800",
            "Seconds a persistent MQTT session (clean session 0) is kept while its client "
            "is not connected (default 7 days, as mosquitto's persistent_client_expiration); "
            "then its record is discarded on every member and a reconnect gets session "
            "present 0 (docs/mqtt.md, \"Session expiry\"). 0: kept for ever."),
    Setting("MqttMaxSessions", "mqtt_max_sessions", _int(0, unit=" of sessions"), "0",
            "Persistent MQTT sessions the server keeps at most: a CONNECT with clean "
            "session 0 that would create one more is refused (CONNACK 3, server "
            "unavailable). The count is the last sweep's (once a minute) plus the sessions "
            "this member created since. 0: no cap."),
)
