"""paho-mqtt (Eclipse Paho, an independent MQTT 3.1.1 client) behind a small blocking
wrapper: connect, subscribe and publish wait for their acknowledgements; received
messages are queued."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion


@dataclass(frozen=True)
class Received:
    topic: str
    payload: bytes
    qos: int
    retain: bool


class PahoClient:
    def __init__(
        self,
        port: int,
        client_id: str = "",
        *,
        clean_session: bool = True,
        username: str | None = None,
        password: str | None = None,
        keepalive: int = 30,
        transport: str = "tcp",
        will: tuple[str, bytes, int, bool] | None = None,
        ca_file: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.timeout = timeout
        self.messages: queue.Queue[Received] = queue.Queue()
        self.connack: queue.Queue[tuple[bool, int]] = queue.Queue()
        self.disconnected = threading.Event()
        self._subacks: dict[int, threading.Event] = {}
        self._granted: dict[int, list[int]] = {}
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=clean_session,
            protocol=paho.MQTTv311,
            transport=transport,  # type: ignore[arg-type]
            reconnect_on_failure=False,
        )
        if username is not None:
            client.username_pw_set(username, password)
        if will is not None:
            client.will_set(will[0], will[1], will[2], will[3])
        if ca_file is not None:
            client.tls_set(ca_certs=ca_file)
        client.on_connect = self._on_connect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        client.on_disconnect = lambda *args: self.disconnected.set()
        self.client = client
        client.connect("127.0.0.1", port, keepalive=keepalive)
        client.loop_start()
        try:
            self.session_present, self.return_code = self.connack.get(timeout=timeout)
        except queue.Empty:  # not left connecting: a CONNACK later would make it a live
            self.drop()  # session nobody reads, taking the client id over from the next
            raise

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:  # type: ignore[no-untyped-def]
        self.connack.put((bool(flags.session_present), reason_code.value))

    def _on_message(self, client, userdata, message) -> None:  # type: ignore[no-untyped-def]
        self.messages.put(Received(message.topic, message.payload, message.qos,
                                   bool(message.retain)))

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:  # type: ignore[no-untyped-def]
        self._granted[mid] = [rc.value for rc in reason_codes]
        self._subacks.setdefault(mid, threading.Event()).set()

    def subscribe(self, topic_filter: str, qos: int = 0) -> list[int]:
        """Subscribe and wait for the SUBACK; the return codes."""
        result, mid = self.client.subscribe(topic_filter, qos)
        assert result == paho.MQTT_ERR_SUCCESS, result
        event = self._subacks.setdefault(mid, threading.Event())
        assert event.wait(self.timeout), f"no SUBACK for {topic_filter!r}"
        return self._granted[mid]

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        """Publish; at QoS 1, wait for the PUBACK."""
        info = self.client.publish(topic, payload, qos=qos, retain=retain)
        if qos:
            info.wait_for_publish(self.timeout)
            assert info.is_published(), f"no PUBACK for {topic!r}"

    def receive(self, count: int, timeout: float | None = None) -> list[Received]:
        return [self.messages.get(timeout=timeout or self.timeout) for _ in range(count)]

    def nothing_more(self, wait: float = 0.5) -> bool:
        try:
            extra = self.messages.get(timeout=wait)
        except queue.Empty:
            return True
        raise AssertionError(f"unexpected message {extra}")

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def drop(self) -> None:
        """End the network connection without DISCONNECT (the will is published)."""
        self.client.loop_stop()
        sock = self.client.socket()
        if sock is not None:
            sock.close()
