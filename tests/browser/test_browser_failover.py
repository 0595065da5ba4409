"""The JavaScript client in a real Chromium against a real Guaranteed cluster: the member
the page is on is SIGKILLed while messages are published; the page resumes on another
member, and its own record shows every acknowledged message once, in order, with
DATA_SYNC and no DATA_RESYNC (the browser twin of test_cluster_sdk_failover.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from browser import PAGES, Browser
from cluster_fixture import LocalCluster
from test_cluster_processes import Publisher

SUBJECT = "/Scores/NBA/LAL"


def page_url(cluster: LocalCluster, servers: list[str]) -> str:
    query = [("client", f"{cluster.http(2)}/client/migratory.js"), ("subject", SUBJECT)]
    query += [("server", server) for server in servers]
    return (PAGES / "failover.html").as_uri() + "?" + urlencode(query)


def test_page_fails_over_and_resumes_without_gap_or_duplicate(
    tmp_path: Path, browser: Browser
) -> None:
    cluster = LocalCluster(tmp_path, members=4, seeds=3)
    cluster.start_all()
    try:
        cluster.wait_ready()
        urls = [cluster.url(i) for i in range(4)]
        browser.open(page_url(cluster, [f"100 {urls[1]}", f"1 {urls[3]}"]))
        record = lambda: browser.run("return window.record")  # noqa: E731

        def subscribed() -> dict[str, Any] | None:
            now = record()
            if now and now["error"]:
                raise AssertionError(f"the page failed: {now['error']}")
            ok = now and any(n[0] == "SUBSCRIBE_ALLOW" for n in now["notifications"])
            return now if ok else None

        first = browser.wait_for("the page subscribed", subscribed, 20)
        on = urls.index(first["servers"][0])
        assert on in (1, 3)
        publisher = Publisher(cluster, 2, count=120, pause=0.01)
        publisher.start()
        killed_at: int | None = None
        deadline = time.monotonic() + 60
        while True:
            now = record()
            got = [m[0] for m in now["messages"]]
            if killed_at is None and len(got) >= 30:
                killed_at = len(got)
                cluster.kill(on)
            acked = [c.decode() for c, _ in publisher.acked]
            if not publisher.is_alive() and set(acked) <= set(got):
                break
            assert time.monotonic() < deadline, (
                f"page got {len(got)} of {len(acked)} acknowledged\n{browser.console()}"
            )
            time.sleep(0.1)
        publisher.finish(30)
        time.sleep(0.5)  # anything late (a duplicate would show now)
        final = record()
    finally:
        cluster.stop()
    messages = final["messages"]
    statuses = [n[0] for n in final["notifications"]]
    print("killed member", on, "after", killed_at, "messages; servers", final["servers"])
    print("notifications", [n for n in final["notifications"] if n[0] == "SERVER_DOWN"])
    print("statuses", statuses)
    down = next(n[4] for n in final["notifications"] if n[0] == "SERVER_DOWN")
    synced = [n[4] for n in final["notifications"] if n[0] == "DATA_SYNC" and n[4] > down]
    if synced:
        print(f"failover: SERVER_DOWN to DATA_SYNC in {synced[0] - down:.0f} ms")
    print("acked", len(publisher.acked), "failed", publisher.failed[:3])
    seqs = [seq for _, _, _, seq in messages]
    assert len({epoch for _, _, epoch, _ in messages}) == 1
    assert seqs == sorted(set(seqs)), "duplicate or reordered delivery reached the page"
    assert [m[0] for m in messages] == [c.decode() for c, _ in publisher.acked]
    assert [m[3] for m in messages] == [p.seq for _, p in publisher.acked]
    # a publish in flight at a killed Raft leader may fail (definitely, never acked)
    assert len(messages) == 120 - len(publisher.failed)
    assert len(publisher.failed) <= 2
    assert all("not published" in (reason or "") for _, reason in publisher.failed)
    assert killed_at is not None and killed_at < len(messages), "the kill came too late"
    assert len(final["servers"]) >= 2 and final["servers"][-1] != urls[on]
    assert "SERVER_DOWN" in statuses
    assert "DATA_SYNC" in statuses[statuses.index("SERVER_DOWN"):]
    assert "DATA_RESYNC" not in statuses
    assert {m[1] for m in messages} <= {"update", "recovered"}
