"""Config keys of persistent MQTT sessions: MqttSessionExpiry, MqttMaxSessions,
MqttSessionMaxSubjects (docs/mqtt.md, "Session expiry", "Session cap" and "Subjects a
session record names")."""

from __future__ import annotations

from migratory.config_values import Setting, _int

SESSION_MAX_SUBJECTS = 10_000
"""The default of MqttSessionMaxSubjects (what a record is bounded by when not told)."""
SESSION_MAX_SUBJECTS_RANGE = (1000, 1_000_000)
"""Its bounds: at least 1,000, so that the subjects a session subscribes to by name (at
most 1,000 filters) always keep their positions; at most 1,000,000 (each save merges the
record's fields into its snapshot on every member: ~0.2 ms per 10,000 positions)."""

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
    Setting("MqttSessionMaxSubjects", "mqtt_session_max_subjects",
            _int(*SESSION_MAX_SUBJECTS_RANGE, unit=" of subjects"), str(SESSION_MAX_SUBJECTS),
            "Subjects a persistent MQTT session's record names a position for, at most "
            "(its record is on every member, in a Guaranteed cluster in the Raft log). "
            "Past it the record forgets the subject delivered least recently -- never one "
            "subscribed to by name --: at a resume that subject is replayed from the start "
            "of its cache (at least once), or gets its snapshot, counted as a resync, when "
            "the cache no longer reaches back. Logged once per session, counted in "
            "migratory_mqtt_session_positions_forgotten_total (docs/mqtt.md, \"Subjects a "
            "session record names\")."),
)
