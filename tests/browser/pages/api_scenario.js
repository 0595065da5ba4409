// The scenario of tests/browser/test_browser_client_api.py, run in pages/api.html.
const [url, token, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
const m = window.migratory;
const outcome = (promise) => promise.then(
  (ok) => ({ ok: true, status: ok.status, seq: ok.position.seq, epoch: ok.position.epoch }),
  (error) => ({ ok: false, error: error.constructor.name, status: error.status ?? null,
                reason: error.reason ?? null }));
(async () => {
  const anonymous = m.connect([url], { name: "anonymous" });
  const publisher = m.connect([url], { name: "publisher", token });
  const notes = [];
  anonymous.onNotification((n) => notes.push([n.status, n.subject, n.reason]));
  const result = {};
  result.denied = await outcome(anonymous.publish("/api/a", "x"));
  result.published = [];
  for (let i = 1; i <= 5; i += 1) {
    result.published.push(await outcome(publisher.publish("/api/a", `m${i}`, { fields: { i: String(i) } })));
  }
  result.tooBig = await outcome(publisher.publish("/api/a", "x".repeat(3000)));
  result.invalid = await outcome(publisher.publish("/api", "x"));
  anonymous.subscribe("/api", { onMessage: () => {} });
  const history = [];
  anonymous.subscribe("/api/a", { history: 3, onMessage: (msg) => history.push([msg.type, msg.seq, msg.text, msg.fields.i]) });
  const conflated = [];
  anonymous.subscribe("/api/c", { conflationMs: 500, onMessage: (msg) => conflated.push(msg.text) });
  const wait = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  for (let i = 0; i < 50 && !(notes.filter((n) => n[0] === "SUBSCRIBE_ALLOW").length === 2 && history.length === 3); i += 1) await wait(100);
  for (let i = 1; i <= 20; i += 1) await publisher.publish("/api/c", `c${i}`);
  for (let i = 0; i < 30 && conflated.at(-1) !== "c20"; i += 1) await wait(100);
  result.history = history;
  result.conflated = conflated;
  result.notes = notes;
  await anonymous.close();
  await publisher.close();
  done(result);
})().catch((error) => done({ failed: String(error) }));
