// A connection cut inside a first subscribe's answer, between its SUBSCRIBE_ALLOW and its
// snapshot (or history): the next session resumes from the ALLOW's position asking for
// the snapshot (the history) as of it, so the application gets it and then every update
// it missed -- not the updates alone (docs/protocol.md, "What the SDKs do with a broken
// server"). A bystander subject, whose answer was complete, resumes as usual. (The
// Python SDK's tests/client/test_sdk_cut_answer.py.)

import assert from "node:assert/strict";
import { test } from "node:test";

import { connect } from "../src/index.js";
import { FakeServer, opFrame } from "./support/fake_server.js";
import { batch, message, status, update } from "./support/fake_websocket.js";

const CUT = "/a/b";
const BYSTANDER = "/c/d";
const GUARD = { timeout: 10_000 }; // a hang guard, not a speed assertion
const RECONNECT = { initialDelay: 0.02, maxDelay: 0.05, jitter: 0, connectTimeout: 0.5 };

const one = (subject, seq, type) => batch([update(subject, seq, { type })]);

async function take(subscription, count) {
  const got = [];
  for (let i = 0; i < count; i += 1) {
    const { value } = await subscription.next();
    got.push(`${value.type} ${value.seq}`);
  }
  return got;
}

for (const snapshotBytes of [0, 5]) {
  test(`a cut ${snapshotBytes} bytes into the snapshot gets the snapshot, then the updates missed`, GUARD, async () => {
    const server = await FakeServer.start();
    const client = connect([server.url], { WebSocket: globalThis.WebSocket, reconnect: RECONNECT });
    try {
      const bystander = client.subscribe(BYSTANDER);
      const conn = await server.nextConnection();
      await conn.acceptSession();
      await conn.expect("subscribe");
      conn.send(status("SUBSCRIBE_ALLOW", BYSTANDER, 7, 5), message(BYSTANDER, 6));
      assert.deepEqual(await take(bystander, 1), ["update 6"]);
      const cut = client.subscribe(CUT);
      await conn.expect("subscribe");
      const snapshot = opFrame(one(CUT, 9, "snapshot")).subarray(0, snapshotBytes);
      conn.reset(Buffer.concat([opFrame(status("SUBSCRIBE_ALLOW", CUT, 7, 10)), snapshot]));

      const again = await server.nextConnection();
      await again.acceptSession();
      const { subjects } = await again.expect("subscribe");
      assert.deepEqual([...subjects].sort((a, b) => a.subject.localeCompare(b.subject)), [
        { subject: CUT, epoch: 7, seq: 10, snapshot: true }, // was: no snapshot asked for
        { subject: BYSTANDER, epoch: 7, seq: 6 },
      ]);
      again.send(
        status("SUBSCRIBE_ALLOW", CUT),
        one(CUT, 9, "snapshot"),
        one(CUT, 11, "recovered"),
        status("DATA_SYNC", CUT, 7, 11),
        status("SUBSCRIBE_ALLOW", BYSTANDER),
        one(BYSTANDER, 7, "recovered"),
        status("DATA_SYNC", BYSTANDER, 7, 7),
        message(CUT, 12),
        message(BYSTANDER, 8),
      );
      assert.deepEqual(await take(cut, 3), ["snapshot 9", "recovered 11", "update 12"]);
      assert.deepEqual(await take(bystander, 2), ["recovered 7", "update 8"]);
    } finally {
      await client.close();
      server.close();
    }
  });
}

test("a cut before the history gets the history, then the updates missed", GUARD, async () => {
  const server = await FakeServer.start();
  const client = connect([server.url], { WebSocket: globalThis.WebSocket, reconnect: RECONNECT });
  try {
    const cut = client.subscribe(CUT, { history: 3 });
    const conn = await server.nextConnection();
    await conn.acceptSession();
    await conn.expect("subscribe");
    conn.reset(opFrame(status("SUBSCRIBE_ALLOW", CUT, 7, 10)));
    const again = await server.nextConnection();
    await again.acceptSession();
    const { subjects } = await again.expect("subscribe");
    // was: a resume without history, which then never came
    assert.deepEqual(subjects, [{ subject: CUT, epoch: 7, seq: 10, history: 3 }]);
    again.send(
      status("SUBSCRIBE_ALLOW", CUT),
      batch([8, 9, 10].map((s) => update(CUT, s, { type: "historical" }))),
      one(CUT, 11, "recovered"),
      status("DATA_SYNC", CUT, 7, 11),
    );
    assert.deepEqual(await take(cut, 4), ["historical 8", "historical 9", "historical 10", "recovered 11"]);
  } finally {
    await client.close();
    server.close();
  }
});
