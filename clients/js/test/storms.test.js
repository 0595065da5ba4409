// The client on node's WebSocket against a server on a real socket (127.0.0.1) that is
// lost 20 times in a row, each time with a publish in flight and messages the next
// session recovers; and a subscribe of many subjects made while the client has no
// session. Each thing the application asked for gets exactly one outcome: every message
// once and in order, one result per publish (PUBLISH_OK, or PublishOutcomeUnknown for one
// whose connection was lost before its status), one session at a time.

import assert from "node:assert/strict";
import { test } from "node:test";

import { PublishOutcomeUnknown, connect } from "../src/index.js";
import { FakeServer } from "./support/fake_server.js";
import { batch, message, status, update } from "./support/fake_websocket.js";

const SUBJECT = "/a/b";
const GUARD = { timeout: 30_000 }; // a hang guard, not a speed assertion
const RECONNECT = { initialDelay: 0.005, maxDelay: 0.02, jitter: 0.5, connectTimeout: 2 };
const LOSSES = 20;

function open(servers) {
  const client = connect(servers, { WebSocket: globalThis.WebSocket, reconnect: RECONNECT });
  const notes = [];
  client.onNotification((n) => notes.push(n.status));
  return { client, notes };
}

test("a server lost 20 times in a row: messages once and in order, one outcome per publish", GUARD, async () => {
  const server = await FakeServer.start();
  const { client, notes } = open([server.url]);
  const got = [];
  client.subscribe(SUBJECT, { onMessage: (m) => got.push(`${m.type} ${m.seq}`) });
  const outcomes = [];
  const publishes = [];
  let seq = 0;
  try {
    for (let life = 0; life < LOSSES; life += 1) {
      const conn = await server.nextConnection();
      await conn.acceptSession();
      const { subjects } = await conn.expect("subscribe");
      assert.deepEqual(subjects, [life === 0 ? { subject: SUBJECT } : { subject: SUBJECT, epoch: 7, seq }]);
      // two messages missed while it was away, recovered; then one live
      const missed = life === 0 ? [] : [seq + 1, seq + 2];
      conn.send(status("SUBSCRIBE_ALLOW", SUBJECT, ...(life === 0 ? [7, 0] : [])),
        batch(missed.map((s) => update(SUBJECT, s, { type: "recovered" }))),
        ...(life === 0 ? [] : [status("DATA_SYNC", SUBJECT, 7, seq + 2)]));
      seq += missed.length;
      const published = client.publish(SUBJECT, `life ${life}`).then(
        (result) => outcomes.push(["ok", life, result.position.seq]),
        (error) => outcomes.push([error.constructor.name, life]),
      );
      publishes.push(published);
      const { closure } = await conn.expect("publish");
      if (life % 2 === 0) { // answered, and its message delivered; then lost
        seq += 1;
        conn.send({ op: "publish_status", status: "PUBLISH_OK", subject: SUBJECT, closure, epoch: 7, seq },
          message(SUBJECT, seq));
        await published;
        while (got.length < seq) await new Promise((resolve) => { setTimeout(resolve, 2); });
      }
      conn.reset(); // an odd life's publish is lost with its status
    }
    await Promise.all(publishes);
    const last = await server.nextConnection(); // the 21st session resumes where it stopped
    await last.acceptSession();
    assert.deepEqual((await last.expect("subscribe")).subjects, [{ subject: SUBJECT, epoch: 7, seq }]);
    assert.equal(server.connections.length, LOSSES + 1); // one session at a time
  } finally {
    await client.close();
    server.close();
  }
  assert.equal(outcomes.length, LOSSES);
  for (const [kind, life, at] of outcomes) {
    if (life % 2 === 0) assert.equal(kind, "ok", `life ${life}`);
    else assert.equal(kind, PublishOutcomeUnknown.name, `life ${life}`);
    if (kind === "ok") assert.ok(at > 0);
  }
  // every message the server numbered, once, in order
  assert.deepEqual(got.map((g) => Number(g.split(" ")[1])), Array.from({ length: seq }, (_, i) => i + 1));
  assert.equal(notes.filter((n) => n === "SERVER_UP").length, LOSSES + 1);
  assert.equal(notes.filter((n) => n === "DATA_RESYNC").length, 0);
});

test("many subjects subscribed between sessions go out split, each once, before a publish", GUARD, async () => {
  const server = await FakeServer.start();
  const { client } = open([server.url]);
  try {
    const first = await server.nextConnection();
    await first.acceptSession();
    await client.waitConnected();
    first.reset();
    while (client.server !== null) await new Promise((resolve) => { setTimeout(resolve, 2); });
    const subjects = Array.from({ length: 1000 }, (_, i) => `/many/s${i}`);
    for (let i = 0; i < subjects.length; i += 100) client.subscribe(subjects.slice(i, i + 100));
    const published = client.publishNoWait(subjects[0], "after the subscribes");
    const conn = await server.nextConnection();
    const connect = await conn.expect("connect");
    assert.equal(connect.op, "connect");
    conn.send({ op: "connected", server: "fake", version: 1, max_subjects_per_subscribe: 64 });
    const asked = [];
    for (;;) {
      const op = await conn.receive();
      if (op.op === "publish") break;
      assert.equal(op.op, "subscribe");
      assert.ok(op.subjects.length <= 64);
      asked.push(...op.subjects.map((s) => s.subject));
    }
    await published;
    assert.deepEqual([...asked].sort(), [...subjects].sort()); // each once, all before the publish
  } finally {
    await client.close();
    server.close();
  }
});
