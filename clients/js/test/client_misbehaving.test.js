// The client against servers that misbehave in ways the protocol does not name, and
// against no server at all: back-off after sessions dropped at once, publishes while
// every server is down, token providers that fail, subscribes too large or too many,
// a DATA_SYNC that claims too much, a pong for a ping not sent, an onMessage that throws.

import assert from "node:assert/strict";
import { mock, test } from "node:test";

import { NotConnectedError, ServerUnavailableError } from "../src/index.js";
import { FAST, SUBJECT, flush, open, take, useFakes } from "./support/client_harness.js";
import { FakeWebSocket, batch, message, status, update } from "./support/fake_websocket.js";

useFakes();

test("publishes while no server answers give up after their timeout and are let go", async () => {
  const { client } = open();
  const waiting = [];
  for (let i = 0; i < 100; i += 1) {
    waiting.push(assert.rejects(client.publish(SUBJECT, "x", { timeout: 0.5 }), NotConnectedError));
    waiting.push(assert.rejects(client.publishNoWait(SUBJECT, "x", { timeout: 0.5 }), NotConnectedError));
  }
  mock.timers.tick(500);
  await Promise.all(waiting); // publishNoWait was: pending for ever
  assert.equal(client.liveWaiters.length, 0); // was: 200 waiters held until a session came
  assert.equal(client.outgoing.length, 0);
  await client.close();
});

test("sessions the server ends at once back off and count as failed attempts", async () => {
  // a member that answers 'connected' and then closes (a crash loop): the back-off was
  // reset by every handshake, so the client came back every initialDelay for ever
  const { client } = open({ reconnect: { ...FAST, maxDelay: 1, multiplier: 2, maxAttempts: 3 } });
  FakeWebSocket.last().accept();
  FakeWebSocket.last().drop(1011, "internal error");
  mock.timers.tick(100);
  FakeWebSocket.last().accept();
  FakeWebSocket.last().drop(1011, "internal error");
  mock.timers.tick(100);
  assert.equal(FakeWebSocket.instances.length, 2, "the second delay is twice the first");
  mock.timers.tick(100);
  FakeWebSocket.last().accept();
  FakeWebSocket.last().drop(1011, "internal error");
  assert.ok(client.error instanceof ServerUnavailableError);
  assert.equal(FakeWebSocket.instances.length, 3);
});

test("sessions that stayed up healthyAfter reset the back-off however they ended", async () => {
  // a rolling restart: each member the client lands on is drained within seconds. Before,
  // only a session that answered a keepalive ping (the first at 15 s) reset the back-off:
  // these counted as failed attempts and maxAttempts ended a client served all along
  const { client } = open({
    reconnect: { ...FAST, maxDelay: 1, multiplier: 2, maxAttempts: 2, healthyAfter: 2 },
  });
  for (let i = 1; i <= 4; i += 1) { // more sessions than maxAttempts: each one was good
    const ws = FakeWebSocket.last();
    ws.accept();
    mock.timers.tick(2000); // up healthyAfter, no ping yet (15 s)
    assert.deepEqual(ws.take("ping"), []);
    ws.drop(4502, "drained");
    mock.timers.tick(100); // initialDelay again
    assert.equal(FakeWebSocket.instances.length, i + 1);
  }
  assert.equal(client.error, null);
  await client.close();
});

test("a session that answers a ping and drops soon is still backed off", async () => {
  // a member in a crash loop that answers pings (or fast pings): before, an answered ping
  // reset the back-off, so the client came back every initialDelay
  const { client } = open({
    reconnect: { ...FAST, maxDelay: 1, multiplier: 2, maxAttempts: 2 },
    keepalive: { interval: 1, timeout: 0.5 },
  });
  let ws = FakeWebSocket.last();
  ws.accept();
  mock.timers.tick(1000);
  ws.receive({ op: "pong", id: ws.take("ping")[0].id });
  ws.drop(1011, "internal error");
  mock.timers.tick(100);
  assert.equal(FakeWebSocket.instances.length, 2);
  ws = FakeWebSocket.last();
  ws.accept();
  mock.timers.tick(1000);
  ws.receive({ op: "pong", id: ws.take("ping")[0].id });
  ws.drop(1011, "internal error");
  assert.ok(client.error instanceof ServerUnavailableError);
  assert.equal(FakeWebSocket.instances.length, 2);
});

test("a token provider that fails or hangs is a failed attempt, retried with back-off", async () => {
  let calls = 0;
  const { client, notes } = open({
    tokenProvider: () => {
      calls += 1;
      if (calls === 1) throw new Error("auth server down");
      if (calls === 2) return new Promise(() => {}); // was: no session ever again
      return "fresh";
    },
  });
  await flush();
  assert.equal(FakeWebSocket.instances.length, 0); // asked before connecting
  mock.timers.tick(100); // the back-off after the failure
  await flush();
  mock.timers.tick(1000); // connectTimeout: the provider did not answer
  await flush();
  mock.timers.tick(200); // the back-off after that
  await flush();
  const socket = FakeWebSocket.last();
  socket.open();
  assert.deepEqual(socket.take("connect"), [{ op: "connect", version: 1, client: "", token: "fresh", heartbeat: 2000 }]);
  assert.deepEqual(notes.filter((n) => n.status === "SERVER_DOWN").map((n) => n.reason), [
    "token provider failed: auth server down",
    "token provider gave no token within 1 s",
  ]);
  await client.close();
});

test("a token provider that keeps failing counts towards maxAttempts", async () => {
  const { client } = open({
    reconnect: { ...FAST, maxAttempts: 2 },
    tokenProvider: async () => { throw new Error("no token"); },
  });
  const ended = assert.rejects(client.waitConnected(), (error) =>
    error instanceof ServerUnavailableError && /no token/.test(error.message));
  await flush();
  mock.timers.tick(100);
  await flush();
  await ended; // was: retried for ever
  assert.equal(FakeWebSocket.instances.length, 0);
});

test("a resume refused whole as too large is asked for one subject at a time", async () => {
  const { client, notes } = open();
  const subscription = client.subscribe(["/a/b", "/c/d", "/e/f"]);
  const first = FakeWebSocket.last();
  first.accept();
  for (const subject of ["/a/b", "/c/d", "/e/f"]) first.receive(status("SUBSCRIBE_ALLOW", subject, 7, 10));
  first.drop();
  client.subscribe("/g/h", { history: 5, onMessage: () => {} }); // first subscribed by the next session
  mock.timers.tick(100);
  const second = FakeWebSocket.last();
  second.accept();
  assert.equal(second.take("subscribe")[0].subjects.length, 4);
  const tooLarge = (subject) => ({ ...status("SUBSCRIBE_DENY", subject),
    reason: "subscribe answer too large: about 9 bytes" });
  for (const subject of ["/a/b", "/c/d", "/e/f", "/g/h"]) second.receive(tooLarge(subject)); // was: all denied for good
  for (const subject of ["/a/b", "/c/d"]) { // each once the answer before it is complete
    assert.deepEqual(second.take("subscribe"), [{ op: "subscribe", subjects: [{ subject, epoch: 7, seq: 10, snapshot: true }] }]);
    second.receive(status("SUBSCRIBE_ALLOW", subject));
    second.receive(batch([update(subject, 11, { type: "recovered" })]));
    second.receive(status("DATA_SYNC", subject, 7, 11));
  }
  assert.deepEqual(second.take("subscribe"), [{ op: "subscribe", subjects: [{ subject: "/e/f", epoch: 7, seq: 10, snapshot: true }] }]);
  second.receive(tooLarge("/e/f")); // a resume too large alone: from the snapshot
  assert.deepEqual(second.take("subscribe"), [{ op: "subscribe", subjects: [{ subject: "/e/f" }] }]);
  second.receive(status("SUBSCRIBE_ALLOW", "/e/f", 7, 30));
  second.receive(batch([update("/e/f", 30, { type: "snapshot" })]));
  assert.deepEqual(second.take("subscribe"), [{ op: "subscribe", subjects: [{ subject: "/g/h", history: 5 }] }]);
  second.receive(tooLarge("/g/h")); // a first subscribe too large alone: denied
  second.receive(message("/e/f", 31));
  assert.deepEqual((await take(subscription, 4)).map((m) => [m.subject, m.type, m.seq]), [
    ["/a/b", "recovered", 11], ["/c/d", "recovered", 11], ["/e/f", "snapshot", 30], ["/e/f", "update", 31],
  ]);
  second.drop();
  mock.timers.tick(100);
  const third = FakeWebSocket.last();
  third.accept();
  assert.deepEqual(third.take("subscribe")[0].subjects.map((s) => s.subject), ["/a/b", "/c/d", "/e/f"]);
  assert.deepEqual(notes.filter((n) => n.status === "SUBSCRIBE_DENY" || n.status === "DATA_RESYNC")
    .map((n) => [n.status, n.subject]), [["DATA_RESYNC", "/e/f"], ["SUBSCRIBE_DENY", "/g/h"]]);
  await client.close();
});

test("a subscribe is split to the server's limit, or else to 100 entries", async () => {
  const { client } = open();
  const subjects = Array.from({ length: 150 }, (_, n) => `/a/${n}`);
  client.subscribe(subjects);
  const first = FakeWebSocket.last();
  first.accept(); // says no limit; was: one subscribe of 150 (closed 4000 by a server whose limit is lower)
  assert.deepEqual(first.take("subscribe").map((op) => op.subjects.length), [100, 50]);
  first.drop();
  mock.timers.tick(100);
  const second = FakeWebSocket.last();
  second.open();
  second.receive({ op: "connected", server: "m", version: 1, max_subjects_per_subscribe: 60 });
  assert.deepEqual(second.take("subscribe").map((op) => op.subjects.length), [60, 60, 30]);
  await client.close();
});

test("a DATA_SYNC past the recovered messages is told as a DATA_RESYNC", async () => {
  const { client, notes } = open();
  const subscription = client.subscribe(SUBJECT);
  const first = FakeWebSocket.last();
  first.accept();
  first.receive(status("SUBSCRIBE_ALLOW", SUBJECT, 7, 10));
  first.drop();
  mock.timers.tick(100);
  const second = FakeWebSocket.last();
  second.accept();
  second.receive(status("SUBSCRIBE_ALLOW", SUBJECT));
  second.receive(batch([update(SUBJECT, 11, { type: "recovered" })])); // 12-14 lost
  second.receive(status("DATA_SYNC", SUBJECT, 7, 14));
  second.receive(message(SUBJECT, 15));
  assert.deepEqual((await take(subscription, 2)).map((m) => m.seq), [11, 15]);
  const sync = notes.filter((n) => n.status.startsWith("DATA_"));
  assert.deepEqual(sync.map((n) => [n.status, n.reason]), [
    ["DATA_RESYNC", "DATA_SYNC at 7:14 but the last message delivered was 7:11"], // was: DATA_SYNC
  ]);
  await client.close();
});

test("an onMessage that throws is reported; the session, its position and other subscriptions go on", async () => {
  const reported = [];
  const before = globalThis.reportError;
  globalThis.reportError = (error) => reported.push(error.message);
  try {
    const { client } = open();
    const other = [];
    client.subscribe(SUBJECT, { onMessage: (m) => { throw new Error(`bug at ${m.seq}`); } });
    client.subscribe("/a/b", { onMessage: (m) => other.push(m.seq) });
    const ws = FakeWebSocket.last();
    ws.accept();
    ws.receive(status("SUBSCRIBE_ALLOW", SUBJECT, 7, 10));
    ws.receive(status("SUBSCRIBE_ALLOW", "/a/b", 7, 0));
    ws.receive(batch([update(SUBJECT, 11), update("/a/b", 1), update(SUBJECT, 12), update("/a/b", 2)]));
    assert.deepEqual(reported, ["bug at 11", "bug at 12"]);
    assert.deepEqual(other, [1, 2]);
    ws.drop();
    mock.timers.tick(100);
    const next = FakeWebSocket.last();
    next.accept(); // handed over, so not asked for again: resumes after 12
    assert.deepEqual(next.take("subscribe")[0].subjects.find((s) => s.subject === SUBJECT),
      { subject: SUBJECT, epoch: 7, seq: 12 });
    await client.close();
  } finally {
    globalThis.reportError = before;
  }
});

test("a pong for a ping not sent yet does not keep a dead connection alive", async () => {
  const { client } = open({ keepalive: { interval: 1, timeout: 0.5 } });
  const ws = FakeWebSocket.last();
  ws.accept();
  ws.receive({ op: "pong", id: 1000000 }); // was: pings 1..1000000 counted as answered
  mock.timers.tick(1000);
  assert.equal(ws.take("ping").length, 1);
  mock.timers.tick(500); // no pong
  assert.equal(ws.closedWith.code, 1000);
  assert.equal(client.server, null);
  await client.close();
});
