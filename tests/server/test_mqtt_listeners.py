"""MQTT on the listener machinery: ListenerRoles (a subscribe-only MQTT port, MQTT over
WebSocket only where the listener speaks mqtt) and MQTT over TLS (ListenMqttEncrypted)
with paho and mosquitto_sub/mosquitto_pub. Certificates by trustme."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trustme
from mqttclient import MqttRawClient, wait_subscriptions
from paho_client import PahoClient
from tls_files import write_tls_files

from migratory.config import Config, ConfigError
from migratory.protocol import mqtt
from migratory.protocol.http import handshake_request, new_websocket_key


@pytest.fixture
def tls_files(tmp_path: Path) -> dict[str, str]:
    return write_tls_files(trustme.CA(), tmp_path)


def test_subscribe_only_mqtt_port_refuses_publishes(start_server: Any, tmp_path: Path) -> None:
    from cluster.tooling import free_base_port

    public, lan = free_base_port(1), free_base_port(1) + 5
    server = start_server(
        ListenMqtt=f"127.0.0.1:{public}, 127.0.0.1:{lan}", BatchTime="0",
        ListenerRoles=f"127.0.0.1:{public} subscribe; 127.0.0.1:{lan} publish",
    )
    assert server.mqtt_port == public
    watcher = PahoClient(public, "watcher")
    assert watcher.subscribe("plant/+/temp", 1) == [1]  # subscribing is fine there
    intruder = MqttRawClient(public)
    intruder.connect("intruder", will=mqtt.Will("plant/a/temp", b"will", 0, False))
    intruder.send(mqtt.Publish("plant/a/temp", b"from outside", qos=1, packet_id=1))
    assert intruder.closed_by_server(), "a publish on a subscribe-only port closes"
    assert "ListenerRoles" in server.log()
    PahoClient(lan, "plc").publish("plant/a/temp", b"from the LAN", qos=1)
    assert [m.payload for m in watcher.receive(1)] == [b"from the LAN"]
    assert watcher.nothing_more()  # neither the publish nor the will got through


def test_mqtt_over_websocket_only_where_the_listener_speaks_mqtt(start_server: Any) -> None:
    from cluster.tooling import free_base_port

    port = free_base_port(1)
    server = start_server(Listen=f"127.0.0.1:{port}",
                          ListenerRoles=f"127.0.0.1:{port} publish native,http")
    assert server.port == port
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(handshake_request("127.0.0.1", "/mqtt", new_websocket_key(),
                                       subprotocol="mqtt"))
        head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 404"), head
    assert b"does not speak mqtt" in head or b"ListenerRoles" in head


def test_mqtt_over_tls_and_wss_with_paho_and_mosquitto(
    start_server: Any, tls_files: dict[str, str]
) -> None:
    server = start_server(
        listeners=2, ListenEncrypted="127.0.0.1:0",
        ListenMqtt="127.0.0.1:0", ListenMqttEncrypted="127.0.0.1:0", BatchTime="0",
        TlsCertificate=tls_files["TlsCertificate"], TlsKey=tls_files["TlsKey"],
    )
    assert server.mqtts_port and server.mqtts_port != server.mqtt_port
    secure = PahoClient(server.mqtts_port, "secure", ca_file=tls_files["ca"])
    assert secure.subscribe("vault/#", 1) == [1]
    assert server.urls[1].startswith("wss://")
    wss = int(server.urls[1].rsplit(":", 1)[1])  # MQTT over WebSocket over TLS
    browser = PahoClient(wss, "browser", transport="websockets", ca_file=tls_files["ca"])
    assert browser.subscribe("vault/+", 1) == [1]
    plain = PahoClient(server.mqtt_port, "plain")
    plain.publish("vault/door", b"opened", qos=1)
    assert [m.payload for m in secure.receive(1)] == [b"opened"]
    assert [m.payload for m in browser.receive(1)] == [b"opened"]
    # mosquitto's clients over TLS, checking the certificate against the CA
    assert shutil.which("mosquitto_sub") and shutil.which("mosquitto_pub")
    port = str(server.mqtts_port)
    sub = subprocess.Popen(
        ["mosquitto_sub", "-h", "127.0.0.1", "-p", port, "--cafile", tls_files["ca"],
         "-t", "vault/+", "-q", "1", "-C", "1", "-v", "-W", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        wait_subscriptions(server.port, 3)  # secure, browser and mosquitto_sub
        subprocess.run(
            ["mosquitto_pub", "-h", "127.0.0.1", "-p", port, "--cafile", tls_files["ca"],
             "-t", "vault/window", "-q", "1", "-m", "closed"], check=True, timeout=10,
        )
        out, err = sub.communicate(timeout=15)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    assert sub.returncode == 0, err
    assert out.decode().splitlines() == ["vault/window closed"]
    assert [m.payload for m in secure.receive(1)] == [b"closed"]
    # mosquitto's TLS clients have closed (close_notify): the server still serves
    # (a TLS session read after its close_notify used to spin the event loop for ever)
    plain.publish("vault/after", b"still here", qos=1)
    assert [m.payload for m in secure.receive(1)] == [b"still here"]
    # SIGINT: a clean stop (a server that does not stop is SIGKILLed after the hang guard)
    assert server.stop(timeout=30) == 0
    # a client that does not trust the certificate never gets in
    refused = subprocess.run(
        ["mosquitto_pub", "-h", "127.0.0.1", "-p", port, "--cafile", tls_files["TlsCertificate"]
         .replace("cert.pem", "ca-missing.pem"), "-t", "vault/x", "-m", "x"],
        capture_output=True, timeout=10,
    )
    assert refused.returncode != 0


def test_listen_mqtt_encrypted_needs_a_certificate(tls_files: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"ListenMqttEncrypted.* is set: TlsCertificate"):
        Config.from_mapping({"ListenMqttEncrypted": "127.0.0.1:8883"})
    tls = {"TlsCertificate": tls_files["TlsCertificate"], "TlsKey": tls_files["TlsKey"]}
    with pytest.raises(ConfigError, match=r"ListenMqtt.* and ListenMqttEncrypted.* both name"):
        Config.from_mapping({"ListenMqtt": "127.0.0.1:1883",
                             "ListenMqttEncrypted": "127.0.0.1:1883", **tls})
    config = Config.from_mapping({"ListenMqttEncrypted": "127.0.0.1:8883", **tls})
    assert config.listen_mqtt_encrypted == (("127.0.0.1", 8883),)
