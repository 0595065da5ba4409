"""The documented browser examples, run as written in Chromium against a real server,
with messages published by the CLI: the 10-line block of clients/js/README.md (only its
port changed, from make serve's 8800 to the test server's) and examples/ticker.html."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from browser import ROOT, Browser

README = ROOT / "clients" / "js" / "README.md"
TICKER = ROOT / "examples" / "ticker.html"


def readme_example() -> str:
    text = README.read_text()
    section = text.split("## Ten lines", 1)[1]
    match = re.search(r"```html\n(.*?)```", section, re.S)
    assert match is not None, "no html block under 'Ten lines'"
    return match.group(1)


def publish(server: Any, subject: str, content: str, *fields: str) -> str:
    args = [sys.executable, "-m", "cluster", "pub", subject, content, "--retained"]
    args += [f"--field={f}" for f in fields] + ["--server", server.url]
    done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout.startswith("PUBLISH_OK"), done.stdout + done.stderr
    return done.stdout


def test_readme_example_works_as_written(
    start_server: Any, browser: Browser, tmp_path: Path
) -> None:
    block = readme_example()
    assert len(block.splitlines()) <= 10
    assert block.count("127.0.0.1:8800") == 2  # what make serve listens on
    server = start_server()
    page = tmp_path / "ticker.html"
    page.write_text(block.replace("127.0.0.1:8800", f"127.0.0.1:{server.port}"))
    publish(server, "/Stocks/NYSE/IBM", "193")  # retained: the snapshot of a new page
    browser.open(page.as_uri())
    out = lambda: browser.run("return document.getElementById('out').textContent")  # noqa: E731
    browser.wait_for("the snapshot shown", lambda: "snapshot 1 193" in out(), 15)
    publish(server, "/Stocks/NYSE/IBM", "194")
    browser.wait_for("the update shown", lambda: "update 2 194" in out(), 15)
    assert out().splitlines() == ["snapshot 1 193", "update 2 194"]


def test_ticker_example_shows_what_the_cli_publishes(
    start_server: Any, browser: Browser
) -> None:
    server = start_server()
    browser.open(f"{TICKER.as_uri()}?server=ws://127.0.0.1:{server.port}")
    status = lambda: browser.run("return document.getElementById('connection').textContent")  # noqa: E731
    browser.wait_for("the ticker connected", lambda: "connected to" in status(), 15)

    def row(subject: str) -> list[str]:
        cells: list[str] = browser.run(
            "return [...document.querySelector(`tr[data-subject='${arguments[0]}']`).cells]"
            ".map((c) => c.textContent)", subject
        )
        return cells

    # the subscription is live once SUBSCRIBE_ALLOW is listed among the events
    events = lambda: browser.run("return document.getElementById('events').textContent")  # noqa: E731
    browser.wait_for("subscribed", lambda: events().count("SUBSCRIBE_ALLOW") == 3, 15)
    publish(server, "/Stocks/NYSE/IBM", "193.12", "volume=6.62M")
    browser.wait_for("the first price", lambda: row("/Stocks/NYSE/IBM")[1] == "193.12", 15)
    publish(server, "/Stocks/NYSE/IBM", "194.00", "volume=7.01M")
    browser.wait_for("the second price", lambda: row("/Stocks/NYSE/IBM")[1] == "194.00", 15)
    _, last, change, fields, seq, kind, _ = row("/Stocks/NYSE/IBM")
    assert (last, change, fields, seq, kind) == ("194.00", "+0.88", "volume=7.01M", "2", "update")
    assert row("/Stocks/NYSE/AAPL")[1] == "-"  # nothing published there
