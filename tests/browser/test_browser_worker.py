"""The JavaScript client runs inside a Web Worker: what clients/js/README.md ("Large
frames") tells a page to do when a large frame decoded on its own thread would stall it.
In Chromium against a real server, a module worker (same origin as the bundle) connects,
takes a history batch of 1,000 messages of 2 kB in one frame, and publishes with an
acknowledgement; the page gets what the worker posts."""

from __future__ import annotations

import http.client
import json
from typing import Any

from browser import Browser

SUBJECT = "/worker/history"
COUNT = 1000

# Runs in the page (selenium's execute_async_script): the server's WebSocket URL, the
# bundle's URL, the subject, the count, selenium's callback. The worker's module imports the bundle.
SCENARIO = """
const [server, bundle, subject, count, done] = arguments;
const source = `
  import { connect } from ${JSON.stringify(bundle)};
  const client = connect([${JSON.stringify(server)}]);
  const seqs = [];
  client.subscribe(${JSON.stringify(subject)}, { history: ${count}, onMessage: async (m) => {
    seqs.push([m.type, m.seq, m.content.length]);
    if (seqs.length !== ${count}) return;
    const history = seqs.slice();
    const { position } = await client.publish(${JSON.stringify(subject)}, "from the worker");
    const hasWindow = typeof window !== "undefined";
    postMessage({ seqs: history, published: position.seq, hasWindow });
    await client.close();
  } });
`;
const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
const worker = new Worker(url, { type: "module" });
worker.onmessage = (event) => done(event.data);
worker.onerror = (event) => done({ failed: String(event.message || event) });
"""


def test_the_client_runs_in_a_worker_and_takes_a_large_batch_there(
    browser: Browser, start_server: Any
) -> None:
    server = start_server(BatchTime="0")
    publisher = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    for i in range(COUNT):
        publisher.request("POST", "/publish", json.dumps({"subject": SUBJECT,
                                                          "content": f"{i:04d}" * 500}))
        answer = publisher.getresponse()
        assert json.loads(answer.read())["seq"] == i + 1
    publisher.close()
    origin = f"http://127.0.0.1:{server.port}"
    browser.open(f"{origin}/healthz")  # any page of the server's origin: the worker's
    browser.driver.set_script_timeout(60)
    result = browser.driver.execute_async_script(
        SCENARIO, server.url, f"{origin}/client/migratory.js", SUBJECT, COUNT
    )
    assert "failed" not in result, (result, browser.console())
    assert result["hasWindow"] is False
    expected = [["historical", seq, 2000] for seq in range(1, COUNT + 1)]
    assert result["seqs"] == expected
    assert result["published"] == COUNT + 1
