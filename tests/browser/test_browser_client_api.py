"""The JavaScript client's API in Chromium against a real server: the publish promise
(PUBLISH_OK with the position, or a typed error for PUBLISH_DENIED, PUBLISH_FAILED and
MESSAGE_SIZE_LIMIT_EXCEEDED), the entitlement token, SUBSCRIBE_DENY, history and
conflation."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import pytest
from browser import PAGES, Browser

TOKEN = "publisher-token"

# Runs in the page (selenium's execute_async_script): arguments are the server URL,
# the publisher's token, and selenium's callback.
SCENARIO = (PAGES / "api_scenario.js").read_text()


@pytest.fixture
def page(browser: Browser, start_server: Any) -> tuple[Browser, Any]:
    server = start_server(Entitlement="Basic", EntitlementAllowToken=TOKEN, MaxMessageSize="1000")
    client = f"http://127.0.0.1:{server.port}/client/migratory.js"
    browser.open((PAGES / "api.html").as_uri() + "?" + urlencode({"client": client}))
    browser.wait_for("the client loaded", lambda: browser.run(
        "return window.loadError || (window.migratory && 'ok')"), 15)
    assert browser.run("return window.loadError ?? null") is None
    return browser, server


def test_publish_outcomes_entitlement_history_and_conflation(page: tuple[Browser, Any]) -> None:
    browser, server = page
    browser.driver.set_script_timeout(30)
    result = browser.driver.execute_async_script(SCENARIO, server.url, TOKEN)
    assert "failed" not in result, result
    assert result["denied"] == {
        "ok": False, "error": "PublishDeniedError", "status": "PUBLISH_DENIED",
        "reason": result["denied"]["reason"],
    }
    published = result["published"]
    assert all(p["ok"] and p["status"] == "PUBLISH_OK" for p in published), published
    assert [p["seq"] for p in published] == [1, 2, 3, 4, 5]
    assert len({p["epoch"] for p in published}) == 1
    assert result["tooBig"]["error"] == "MessageSizeLimitExceededError"
    assert result["tooBig"]["status"] == "MESSAGE_SIZE_LIMIT_EXCEEDED"
    assert result["invalid"]["error"] == "PublishFailedError"
    assert result["invalid"]["status"] == "PUBLISH_FAILED"
    assert "segment" in result["invalid"]["reason"]
    # history: the last 3 cached messages, oldest first, as historical, with their fields
    assert result["history"] == [
        ["historical", 3, "m3", "3"], ["historical", 4, "m4", "4"], ["historical", 5, "m5", "5"],
    ]
    # conflation 500 ms over 20 quick publishes: fewer messages, the last one kept
    conflated = result["conflated"]
    assert conflated[-1] == "c20" and len(conflated) < 20, conflated
    deny = [n for n in result["notes"] if n[0] == "SUBSCRIBE_DENY"]
    assert [n[1] for n in deny] == ["/api"] and "segment" in deny[0][2]
