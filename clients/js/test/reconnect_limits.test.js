// The reconnect loop at its limits, on mocked timers: members that refuse every fresh
// token for ten minutes, or never answer; a resume after many failed attempts. The
// Python SDK's tests/client/test_sdk_reconnect_limits.py does the same.

import assert from "node:assert/strict";
import { mock, test } from "node:test";

import { connect } from "../src/index.js";
import { SUBJECT, flush, take, useFakes } from "./support/client_harness.js";
import { FakeWebSocket, batch, message, status, update } from "./support/fake_websocket.js";
import { seeded } from "./support/random.js";

useFakes();

const SERVERS = ["ws://a:1", "ws://b:1", "ws://c:1"];
const MINUTE = 60_000;
const STEP = 50; // ms of virtual time per turn

/** Run `minutes` of virtual time; `member(ws)` plays the server of every new attempt.
 * Returns the virtual time (ms) of each attempt. */
async function run(minutes, member) {
  const attempts = [];
  let seen = 0;
  for (let now = 0; now < minutes * MINUTE; now += STEP) {
    mock.timers.tick(STEP);
    await flush();
    while (FakeWebSocket.instances.length > seen) {
      attempts.push(now);
      member(FakeWebSocket.instances[seen]);
      seen += 1;
      assert.ok(seen < 1000, "a hot loop");
    }
  }
  return attempts;
}

/** A client of SERVERS on fake sockets, and the notifications it gives. */
function open(seed, options) {
  const client = connect(SERVERS, { WebSocket: FakeWebSocket, random: seeded(seed), ...options });
  const notes = [];
  client.onNotification((n) => notes.push(n));
  return { client, notes };
}

function perMinute(attempts, minutes) {
  const counts = Array(minutes).fill(0);
  for (const at of attempts) counts[Math.floor(at / MINUTE)] += 1;
  return counts;
}

test("every fresh token refused (4503) for ten minutes: bounded, growing, jittered", async () => {
  let issued = 0;
  const { client, notes } = open(5, { tokenProvider: async () => `fresh-${++issued}` });
  const tokens = [];
  const attempts = await run(10, (ws) => {
    ws.open();
    tokens.push(ws.take("connect")[0].token);
    ws.drop(4503, "the token expired");
  });
  const counts = perMinute(attempts, 10);
  assert.ok(counts.slice(1).every((n) => n >= 2 && n <= 5), String(counts));
  assert.ok(attempts.length <= 40, String(counts));
  const gaps = attempts.slice(1).map((at, i) => at - attempts[i]);
  assert.ok(gaps.slice(8).every((g) => g >= 15_000 - STEP && g <= 30_000 + STEP), String(gaps));
  assert.ok(gaps[0] <= 500 + STEP && Math.max(...gaps.slice(0, 5)) < 15_000, String(gaps));
  assert.ok(new Set(gaps.slice(8)).size > 3, "jittered");
  assert.deepEqual(tokens, Array.from({ length: attempts.length }, (_, i) => `fresh-${i + 1}`));
  assert.equal(notes.length, attempts.length);
  assert.ok(notes.every((n) => n.status === "SERVER_DOWN" && /4503 TOKEN_EXPIRED/.test(n.reason)));
  assert.equal(client.error, null);
  await client.close();
});

test("members down, silent, or dropping after the upgrade: the same back-off", async () => {
  const { client, notes } = open(6, { reconnect: { connectTimeout: 2 } });
  const kinds = { "ws://a:1": "down", "ws://b:1": "silent", "ws://c:1": "upgrade-close" };
  const attempts = await run(10, (ws) => {
    if (kinds[ws.url] === "down") ws.drop(1006);
    if (kinds[ws.url] === "upgrade-close") {
      ws.open();
      ws.drop(1006);
    }
  });
  const counts = perMinute(attempts, 10);
  // at least one attempt in every 32 s (30 s of back-off, 2 s on the silent member)
  assert.ok(counts.slice(1).every((n) => n >= 1 && n <= 5), String(counts));
  assert.ok(notes.length === attempts.length || notes.length === attempts.length - 1);
  const silent = notes.filter((n) => n.server === "ws://b:1");
  assert.ok(silent.length > 0 && silent.every((n) => /within 2 s/.test(n.reason)));
  await client.close();
});

test("a resume after 30 refused attempts keeps the position: no gap, no duplicate", async () => {
  const { client } = open(7, { reconnect: { initialDelay: 0.1, maxDelay: 1, connectTimeout: 1 } });
  const subscription = client.subscribe(SUBJECT);
  const first = FakeWebSocket.last();
  first.accept("m1");
  first.take("subscribe");
  first.receive(status("SUBSCRIBE_ALLOW", SUBJECT, 7, 10));
  first.receive(message(SUBJECT, 11));
  assert.deepEqual((await take(subscription, 1)).map((m) => m.seq), [11]);
  first.drop();
  let refused = 0;
  let served = null;
  for (let turn = 0; served === null && turn < 2000; turn += 1) {
    mock.timers.tick(STEP);
    await flush();
    const ws = FakeWebSocket.last();
    if (ws === first || ws.readyState !== 0) continue;
    if (refused < 30) {
      refused += 1;
      ws.open();
      ws.drop(refused % 2 ? 4503 : 1006);
    } else {
      served = ws;
    }
  }
  assert.ok(served !== null, "no attempt after 30 refusals");
  served.accept("m2");
  assert.deepEqual(served.take("subscribe"), [
    { op: "subscribe", subjects: [{ subject: SUBJECT, epoch: 7, seq: 11 }] },
  ]);
  served.receive(status("SUBSCRIBE_ALLOW", SUBJECT));
  served.receive(batch([11, 12, 13].map((s) => update(SUBJECT, s, { type: "recovered" }))));
  served.receive(status("DATA_SYNC", SUBJECT, 7, 13));
  served.receive(message(SUBJECT, 14));
  const resumed = await take(subscription, 3);
  assert.deepEqual(resumed.map((m) => [m.seq, m.type]),
    [[12, "recovered"], [13, "recovered"], [14, "update"]]);
  await client.close();
});

test("4003 CONNECT_DENIED ends the client at the first, whatever the provider would give", async () => {
  let issued = 0;
  const { client, notes } = open(8, { tokenProvider: async () => `fresh-${++issued}` });
  const attempts = await run(10, (ws) => {
    ws.open();
    ws.drop(4003, "entitlement refused the connection");
  });
  assert.equal(attempts.length, 1);
  assert.equal(issued, 1);
  assert.equal(client.error?.code, 4003);
  assert.deepEqual(notes.map((n) => [n.status, n.reason]), [
    ["SERVER_DOWN", "closed with 4003 CONNECT_DENIED: entitlement refused the connection"]]);
});

test("4504 TOKEN_NOT_YET_VALID backs off and asks the provider again until the token is taken", async () => {
  // the issuer's clock ahead of a member's: refused now, accepted once its time comes
  // (was 4003, which ended the client at the first)
  let issued = 0;
  const { client, notes } = open(9, { tokenProvider: async () => `fresh-${++issued}` });
  const tokens = [];
  const attempts = await run(1, (ws) => {
    ws.open();
    const token = ws.take("connect")[0].token;
    tokens.push(token);
    if (token === "fresh-4") ws.receive({ op: "connected", server: "a", version: 1 });
    else ws.drop(4504, "the token is not valid before (nbf) 90 s from now");
  });
  // (the fake answers no heartbeat: the session it took is given up seconds later)
  assert.deepEqual(tokens.slice(0, 4), ["fresh-1", "fresh-2", "fresh-3", "fresh-4"]);
  assert.equal(client.error, null);
  assert.deepEqual(notes.slice(0, 3).map((n) => n.status), Array(3).fill("SERVER_DOWN"));
  assert.ok(notes.slice(0, 3).every((n) => /4504 TOKEN_NOT_YET_VALID/.test(n.reason)),
    JSON.stringify(notes.slice(0, 3)));
  assert.notEqual(notes[3].status, "SERVER_DOWN", JSON.stringify(notes[3]));
  assert.ok(attempts[1] - attempts[0] >= 250 - STEP, String(attempts)); // backed off: no hot loop
  await client.close();
});
