"""The stand-in connection the in-process MQTT benchmarks give an ``MqttSession``: it
never writes (the benchmarks count what the session does, not the socket)."""


class Wire:
    writing = False

    def mark_dirty(self) -> None:
        pass

    def flush_now(self) -> None:
        pass
