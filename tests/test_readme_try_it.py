"""README, "Try it": the lines an operator copies first, run as written against a
started server -- only its port changed (8800 and 1883 may be taken on a shared machine:
``--server`` added to ``pub``/``sub``, the port replaced in the URLs) and ``sub`` given
``--count`` to end. What README says each prints is what they print."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from listen_ports import listen_ports

README = Path(__file__).resolve().parents[1] / "README.md"
BIN = Path(sys.executable).parent


def try_it_lines() -> list[list[str]]:
    """The shell lines of every ``sh`` block of the "Try it" section, in order."""
    section = README.read_text().split("\n## Try it\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    return [shlex.split(line) for block in blocks for line in block.splitlines() if line]


def said_to_print(command: str) -> str:
    """What the README says ``command`` prints ("`pub` prints `...`"), as a pattern
    whose ``…`` stand for numbers. Before: it said ``PUBLISH_OK epoch=… seq=…``, where
    ``pub`` prints the subject too."""
    (said,) = re.findall(rf"`{command}` prints `([^`]+)`", README.read_text())
    return re.escape(said).replace(re.escape("…"), "…")


def as_run(words: list[str], port: int, mqtt_port: int) -> list[str]:
    words = [w.replace("127.0.0.1:8800", f"127.0.0.1:{port}")
              .replace("127.0.0.1:1883", f"127.0.0.1:{mqtt_port}") for w in words]
    if words[0] == ".venv/bin/migratory":
        words[0] = str(BIN / "migratory")
        if words[1] in ("pub", "sub"):
            words += ["--server", f"ws://127.0.0.1:{port}"]
    return [str(mqtt_port) if w == "1883" else w for w in words]  # (mosquitto's -p)


@pytest.fixture
def server() -> Iterator[tuple[int, int]]:
    """``migratory serve`` as the MQTT block starts it (the first block's server plus an
    MQTT listener), on free ports."""
    port, mqtt_port = listen_ports(2)
    process = subprocess.Popen(
        [str(BIN / "migratory"), "serve", "--set", f"Listen=127.0.0.1:{port}",
         "--set", f"ListenMqtt=127.0.0.1:{mqtt_port}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("listening ws://127.0.0.1:")
        yield port, mqtt_port
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_the_readmes_try_it_lines_do_what_it_says(server: tuple[int, int]) -> None:
    port, mqtt_port = server
    lines = [as_run(words, port, mqtt_port) for words in try_it_lines()]
    sub, pub, snapshot, events, post, serve_mqtt, mqtt_sub, mqtt_pub = lines
    assert serve_mqtt[1:3] == ["serve", "--set"]  # (the fixture's server stands for it)
    assert shutil.which("mosquitto_pub"), "make debian-test-packages installs mosquitto-clients"
    subscriber = subprocess.Popen([*sub, "--count", "3"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
    stream = subprocess.Popen([*events[:-1], "--max-time", "30", events[-1]],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert subscriber.stderr is not None and stream.stdout is not None
        for line in subscriber.stderr:  # (to EOF at most)
            if line.startswith("SUBSCRIBE_ALLOW"):
                break  # subscribed: the publishes below are updates
        for line in stream.stdout:
            if line == "event:subscribe\n":
                break
        published = subprocess.run(pub, capture_output=True, text=True, timeout=60)
        assert re.fullmatch(r"PUBLISH_OK /Stocks/NYSE/IBM epoch=\d+ seq=1\n", published.stdout)
        assert re.fullmatch(said_to_print("pub").replace("…", r"\d+"), published.stdout[:-1])
        got = json.loads(subprocess.run(snapshot, capture_output=True, timeout=60).stdout)
        assert (got["content"], got["fields"], got["seq"], got["type"]) == (
            "193", {"volume": "6.62M"}, 1, "snapshot")
        answer = json.loads(subprocess.run(post, capture_output=True, timeout=60).stdout)
        assert (answer["status"], answer["seq"]) == ("PUBLISH_OK", 2)
        streamed = [stream.stdout.readline()]  # 193 (pub), then the POST's 194 (or EOF)
        while '"content":"194"' not in streamed[-1] and streamed[-1]:
            streamed.append(stream.stdout.readline())
        assert '"content":"194","fields":{"bid":"194"}' in streamed[-1], streamed
        subprocess.run(mqtt_pub, check=True, timeout=60)
        heard = subprocess.run([*mqtt_sub, "-C", "1"], capture_output=True, text=True,
                               timeout=60)
        assert heard.stdout == "Stocks/NYSE/IBM 194\n"  # the retained message
        out, _ = subscriber.communicate(timeout=60)
    finally:
        for process in (subscriber, stream):
            if process.poll() is None:
                process.kill()
            process.wait()
    assert [line.split()[:5:4] for line in out.splitlines()] == [
        ["update", "193"], ["update", "194"], ["update", "194"]], out


def sdk_example() -> str:
    """The README's ``python`` block (the SDK, "From Python (trio)")."""
    (block,) = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    return block


def test_the_readmes_sdk_example_prints_what_it_says(server: tuple[int, int]) -> None:
    """Run as written (its port replaced): it publishes, prints the PUBLISH_OK and the
    position, then the snapshot it subscribed to; it would go on printing, so it is
    stopped once it did. Before: the README's one Python example was run by no test."""
    port, _ = server
    code = sdk_example().replace("127.0.0.1:8800", f"127.0.0.1:{port}")
    example = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert example.stdout is not None
        published, received = example.stdout.readline(), example.stdout.readline()
    finally:
        example.kill()
        _, err = example.communicate(timeout=60)
    assert re.fullmatch(r"PUBLISH_OK Position\(epoch=\d+, seq=1\)\n", published), (
        published, err)
    assert received == "snapshot 1 b'193'\n", (received, err)
