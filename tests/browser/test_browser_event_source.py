"""A plain ``EventSource`` in a real Chromium against a real server (docs/http.md): the
messages of two subjects on one stream with their positions as ids; the connection cut
by a loopback proxy (chaos/proxy.py) while a publisher keeps publishing over HTTP; the
browser's own reconnect with ``Last-Event-ID`` getting exactly the missed messages then
``sync`` -- or, when the cache no longer reaches back, the snapshot then ``resync``.

The page is on the server's origin and the stream goes through the proxy's port: a
cross-origin ``EventSource`` (``HttpCorsOrigins``), the case with the most to get wrong.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
import trio
from browser import PAGES, Browser
from listen_ports import listen_port

from chaos.proxy import Proxy

A, B = "/Stocks/NYSE/IBM", "/Stocks/NYSE/MSFT"
RECORDER = (PAGES / "event_source.js").read_text()


def free_port() -> int:
    return listen_port()  # below the ephemeral range: tests/listen_ports.py


class ProxyThread:
    """chaos/proxy.py's Proxy on a loopback port, in its own trio thread: the test cuts
    every connection through it and holds new ones (blackhole) until it heals."""

    def __init__(self, upstream_port: int) -> None:
        self.port = free_port()
        self.proxy = Proxy("event-source", self.port, upstream_port)
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)

    async def _main(self) -> None:
        self._token, self._stop = trio.lowlevel.current_trio_token(), trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(self.proxy.serve)
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def __enter__(self) -> ProxyThread:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(10)

    def cut(self) -> int:
        """Close every open connection; hold new ones until :meth:`heal`."""
        def cut_all() -> int:
            self.proxy.set(blackhole=True)
            return self.proxy.reset()

        closed: int = trio.from_thread.run_sync(cut_all, trio_token=self._token)
        return closed

    def heal(self) -> None:
        trio.from_thread.run_sync(self.proxy.heal, trio_token=self._token)


class Publisher(threading.Thread):
    """Publishes over HTTP (``POST /publish``, straight to the server), A and B in turn,
    until stopped or ``limit`` messages; ``published`` holds (subject, seq, content, i)."""

    def __init__(self, port: int, *, retained: bool, limit: int = 1500) -> None:
        super().__init__(daemon=True)
        self.port, self.retained, self.limit = port, retained, limit
        self.published: list[tuple[str, int, str, str]] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            for i in range(self.limit):
                if self.stopping.is_set():
                    break
                subject = (A, B)[i % 2]
                body = {"subject": subject, "content": f"m{i}", "fields": {"i": str(i)},
                        "retained": self.retained}
                connection.request("POST", "/publish", json.dumps(body),
                                   {"Content-Type": "application/json"})
                reply = json.loads(connection.getresponse().read())
                assert reply["status"] == "PUBLISH_OK", reply
                self.published.append((subject, reply["seq"], f"m{i}", str(i)))
                time.sleep(0.005)
        except BaseException as exc:
            self.error = exc
        finally:
            connection.close()

    def count(self, subject: str) -> int:
        return sum(1 for s, *_ in list(self.published) if s == subject)

    def finish(self) -> None:
        self.stopping.set()
        self.join(15)
        assert not self.is_alive() and self.error is None, self.error


def stats(port: int) -> dict[str, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/stats")
        result: dict[str, Any] = json.loads(connection.getresponse().read())
        return result
    finally:
        connection.close()


@pytest.fixture
def stream(
    browser: Browser, start_server: Any, request: pytest.FixtureRequest
) -> Iterator[tuple[Browser, Any, ProxyThread]]:
    """A server (with the test's settings), the proxy before it, and the page's
    EventSource of A and B through the proxy, both subjects subscribed."""
    settings = getattr(request, "param", {})
    server = start_server(HttpCorsOrigins="*", **settings)
    with ProxyThread(server.port) as proxy:
        browser.open(f"http://127.0.0.1:{server.port}/healthz")  # the page's origin
        query = urlencode([("subject", A), ("subject", B)])
        browser.run(RECORDER, f"http://127.0.0.1:{proxy.port}/events?{query}")
        browser.wait_for("both subjects subscribed", lambda: len(
            [e for e in events(browser) if e["type"] == "subscribe"]) == 2, 10)
        yield browser, server, proxy


def record(browser: Browser) -> dict[str, Any]:
    result: dict[str, Any] = browser.run("return window.record")
    return result


def events(browser: Browser) -> list[dict[str, Any]]:
    return list(record(browser)["events"])


def messages_of(got: list[dict[str, Any]], subject: str | None = None) -> list[dict[str, Any]]:
    return [e["data"] for e in got
            if e["type"] == "message" and subject in (None, e["data"]["subject"])]


def messages(browser: Browser, subject: str | None = None) -> list[dict[str, Any]]:
    return messages_of(events(browser), subject)


def cut_while_publishing(
    browser: Browser, proxy: ProxyThread, publisher: Publisher, *, during: int
) -> int:
    """Cut the stream once the page has had some messages live; heal once the page saw
    the connection drop and ``during`` more messages of each subject were published.
    Returns the number of messages published before the cut."""
    browser.wait_for("live messages", lambda: len(messages(browser)) >= 10, 10)
    before = len(publisher.published)
    assert proxy.cut() >= 1, "the stream was not open through the proxy"
    browser.wait_for("the page saw the drop", lambda: record(browser)["errors"], 10)
    deadline = time.monotonic() + 10
    while min(publisher.count(A), publisher.count(B)) < before // 2 + during:
        assert time.monotonic() < deadline and publisher.is_alive(), publisher.error
        time.sleep(0.02)
    proxy.heal()
    return before


def finish(browser: Browser, publisher: Publisher) -> list[dict[str, Any]]:
    """Go on publishing until the page has had 10 live messages after its reconnect (the
    resume and the live stream racing), stop, and wait until the page has the last
    message of each subject; the page's events then."""

    def live_again() -> bool:
        got = events(browser)
        told = [i for i, e in enumerate(got) if e["type"] in ("sync", "resync")]
        return bool(told) and len(messages_of(got[told[-1]:])) >= 10

    browser.wait_for("live messages after the reconnect", live_again, 10)
    publisher.finish()
    last = {s: seq for s, seq, *_ in publisher.published}
    arrived = lambda: {m["subject"]: m["seq"] for m in messages(browser)}  # noqa: E731
    try:
        browser.wait_for("the last messages", lambda: arrived() == last, 10)
    except TimeoutError as exc:
        raise AssertionError(f"the page's last {arrived()}, published {last}") from exc
    time.sleep(0.3)  # anything late (a duplicate would show now)
    return events(browser)


def check_ids(got: list[dict[str, Any]]) -> None:
    """Every event's lastEventId is the stream's position after it: each subject's last
    update/recovered message or the position its subscribe/sync/resync gave."""
    marks: dict[str, str] = {}
    for event in got:
        data = event["data"]
        moves = event["type"] != "message" or data["type"] in ("update", "recovered")
        if moves and "epoch" in data:
            marks[data["subject"]] = f"{data['epoch']}:{data['seq']}"
        expected = ",".join(marks.get(s, "-") for s in (A, B))
        assert event["id"] == expected, (event, expected)


def test_live_messages_then_the_browsers_own_reconnect_gets_exactly_the_missed(
    stream: tuple[Browser, Any, ProxyThread],
) -> None:
    browser, server, proxy = stream
    publisher = Publisher(server.port, retained=False)
    publisher.start()
    before = cut_while_publishing(browser, proxy, publisher, during=15)
    got = finish(browser, publisher)
    published = publisher.published
    page = record(browser)

    # one EventSource, reopened by itself after the drop (retry, Last-Event-ID)
    assert len(page["opens"]) == 2, page
    assert page["errors"][0][0] == 0, "the EventSource gave up instead of reconnecting"
    # messages come as EventSource's default type with their data as JSON
    by_type = [e for e in got if e["type"] == "message"]
    assert {m["data"]["type"] for m in by_type} == {"update", "recovered"}
    for subject in (A, B):
        sent = [(seq, content, {"i": i}) for s, seq, content, i in published if s == subject]
        seen = [(m["seq"], m["content"], m["fields"]) for m in messages(browser, subject)]
        assert seen == sent, f"{subject}: not exactly what was published, in order"
    check_ids(got)
    # after the reconnect: per subject its subscribe, the missed messages, then sync
    reopened = [i for i, e in enumerate(got) if e["type"] == "subscribe"][2]
    resumed = [(e["type"], e["data"]["subject"], e["data"].get("type")) for e in got[reopened:]]
    for subject in (A, B):
        start = resumed.index(("subscribe", subject, None))
        end = resumed.index(("sync", subject, None))
        missed = resumed[start + 1:end]
        assert missed and set(missed) == {("message", subject, "recovered")}, missed
        sync = got[reopened + end]["data"]
        recovered = [e for e in got[reopened + start:reopened + end] if e["type"] == "message"]
        assert sync["seq"] == recovered[-1]["data"]["seq"]
        assert len(recovered) >= 10, "too few messages published while it was cut"
    assert {e["data"]["type"] for e in got[:reopened] if e["type"] == "message"} == {"update"}
    live = resumed[resumed.index(("sync", B, None)) + 1:]
    assert live and set(live) <= {("message", A, "update"), ("message", B, "update")}, live
    assert stats(server.port)["resumes"] == {"sync": 2}  # migratory_resumes_total
    print(f"{before} published before the cut, {len(published)} in all; reconnected "
          f"{page['opens'][1] - page['errors'][0][1]:.0f} ms after the drop")


@pytest.mark.parametrize("stream", [{"MaxCachedMessagesPerSubject": "5"}], indirect=True)
def test_when_the_cache_does_not_reach_back_the_reconnect_gets_the_snapshot_and_resync(
    stream: tuple[Browser, Any, ProxyThread],
) -> None:
    browser, server, proxy = stream
    publisher = Publisher(server.port, retained=True)  # retained: each one is the snapshot
    publisher.start()
    before = cut_while_publishing(browser, proxy, publisher, during=15)  # 15 > the 5 cached
    got = finish(browser, publisher)
    page = record(browser)

    assert len(page["opens"]) == 2, page
    assert page["errors"][0][0] == 0, "the EventSource gave up instead of reconnecting"
    assert not [e for e in got if e["type"] == "sync" or e["data"].get("type") == "recovered"]
    check_ids(got)
    for subject in (A, B):
        sent = [(seq, content) for s, seq, content, _ in publisher.published if s == subject]
        mine = [e for e in got if e["data"]["subject"] == subject]
        kinds = [(e["type"], e["data"].get("type")) for e in mine]
        again = kinds.index(("subscribe", None), 1)  # the reconnect
        assert kinds[again:again + 3] == [
            ("subscribe", None), ("message", "snapshot"), ("resync", None)], kinds
        snapshot, resync = mine[again + 1]["data"], mine[again + 2]["data"]
        assert resync["seq"] == snapshot["seq"]
        seen = [(e["data"]["seq"], e["data"]["content"]) for e in mine if e["type"] == "message"]
        up_to_cut = seen[:sum(1 for e in mine[:again] if e["type"] == "message")]
        assert snapshot["seq"] - up_to_cut[-1][0] > 5, "resynced though the cache reached back"
        # no silent gap: all up to the cut, then from the snapshot on, the one jump told
        assert seen == sent[:len(up_to_cut)] + sent[sent.index(seen[len(up_to_cut)]):]
        assert seen[-1] == sent[-1]
    assert stats(server.port)["resumes"] == {"resync": 2}
    print(f"{before} published before the cut, {len(publisher.published)} in all; "
          f"reconnected {page['opens'][1] - page['errors'][0][1]:.0f} ms after the drop")
