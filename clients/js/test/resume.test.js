// SubjectTracker: dedupe, gap detection and resume positions, without I/O (the same
// cases as the Python SDK's tests/client/test_sdk_resume.py).

import assert from "node:assert/strict";
import { test } from "node:test";

import fc from "fast-check";

import { Message, SubjectTracker, Verdict, position } from "../src/index.js";

const SUBJECT = "/a/b";
const msg = (seq, epoch = 7, type = "update") => new Message({
  subject: SUBJECT, content: new TextEncoder().encode(String(seq)), epoch, seq, type,
});

function allowed(at = position(7, 10), options = {}) {
  const tracker = new SubjectTracker(SUBJECT, options);
  tracker.onStatus("SUBSCRIBE_ALLOW", at);
  return tracker;
}

test("the first request asks for history, later ones resume", () => {
  const tracker = new SubjectTracker(SUBJECT, { history: 5, conflationMs: 500 });
  assert.deepEqual(tracker.request(), { subject: SUBJECT, position: null, history: 5, conflationMs: 500 });
  tracker.onStatus("SUBSCRIBE_ALLOW", position(7, 10));
  // the history has not come yet: a resume now asks for it as of the position
  assert.deepEqual(tracker.request(), {
    subject: SUBJECT, position: position(7, 10), history: 5, conflationMs: 500, snapshot: false,
  });
  tracker.onMessage(msg(11));
  assert.deepEqual(tracker.request(), {
    subject: SUBJECT, position: position(7, 11), history: 0, conflationMs: 500, snapshot: false,
  });
});

test("a first answer cut inside its history resumes asking for the rest", () => {
  // was: the resume asked for no history, so what the cut took never came
  const tracker = allowed(position(7, 10), { history: 5 });
  for (const seq of [6, 7]) assert.equal(tracker.onMessage(msg(seq, 7, "historical")), Verdict.DELIVER);
  tracker.onSessionLost();
  assert.equal(tracker.request().history, 3);
  tracker.onStatus("SUBSCRIBE_ALLOW", null);
  assert.deepEqual([7, 8, 9, 10].map((s) => tracker.onMessage(msg(s, 7, "historical"))),
    [Verdict.DUPLICATE, Verdict.DELIVER, Verdict.DELIVER, Verdict.DELIVER]);
  assert.equal(tracker.onMessage(msg(11, 7, "recovered")), Verdict.DELIVER);
  assert.equal(tracker.request().history, 0);
});

test("a first answer cut before its snapshot resumes asking for it", () => {
  // was: the resume from the ALLOW's position asked for nothing more, so the snapshot
  // the first subscribe owed never came
  const tracker = allowed();
  tracker.onSessionLost();
  assert.deepEqual(tracker.request(), {
    subject: SUBJECT, position: position(7, 10), history: 0, conflationMs: 0, snapshot: true,
  });
  tracker.onStatus("SUBSCRIBE_ALLOW", null); // the resume's answer, cut again
  tracker.onSessionLost();
  assert.equal(tracker.request().snapshot, true);
  tracker.onStatus("SUBSCRIBE_ALLOW", null);
  assert.equal(tracker.onMessage(msg(9, 7, "snapshot")), Verdict.DELIVER);
  assert.equal(tracker.request().snapshot, false);
});

test("the snapshot is asked for only while the first answer is open", () => {
  const updated = allowed();
  updated.onMessage(msg(11)); // the answer closed: no snapshot was coming
  assert.equal(updated.request().snapshot, false);
  const synced = allowed();
  synced.onStatus("DATA_RESYNC", position(7, 12));
  assert.equal(synced.request().snapshot, false);
  assert.equal(allowed(position(7, 10), { history: 3 }).request().snapshot, false);
  const resumed = new SubjectTracker(SUBJECT, { position: position(7, 10) });
  resumed.onStatus("SUBSCRIBE_ALLOW", null); // a plain resume owes none either
  assert.equal(resumed.request().snapshot, false);
});

test("live updates in order are delivered", () => {
  const tracker = allowed();
  assert.deepEqual([11, 12, 13].map((s) => tracker.onMessage(msg(s))), Array(3).fill(Verdict.DELIVER));
  assert.deepEqual(tracker.position, position(7, 13));
});

test("duplicates are dropped", () => {
  const tracker = allowed();
  tracker.onMessage(msg(11));
  assert.equal(tracker.onMessage(msg(11)), Verdict.DUPLICATE);
  assert.equal(tracker.onMessage(msg(3, 7, "recovered")), Verdict.DUPLICATE);
  assert.deepEqual(tracker.position, position(7, 11));
});

test("snapshot and historical messages pass through without moving the position", () => {
  const tracker = allowed();
  assert.equal(tracker.onMessage(msg(10, 7, "snapshot")), Verdict.DELIVER);
  assert.deepEqual(tracker.position, position(7, 10));
  const history = allowed(position(7, 10), { history: 2 });
  assert.equal(history.onMessage(msg(9, 7, "historical")), Verdict.DELIVER);
  assert.equal(history.onMessage(msg(10, 7, "historical")), Verdict.DELIVER);
  assert.deepEqual(history.position, position(7, 10));
});

test("only a subscribe's answer has a snapshot or history", () => {
  // was: every snapshot and historical message delivered, whenever it came: an old
  // message after newer ones, or the same one twice
  const tracker = allowed();
  assert.equal(tracker.onMessage(msg(10, 7, "snapshot")), Verdict.DELIVER);
  assert.equal(tracker.onMessage(msg(10, 7, "snapshot")), Verdict.DUPLICATE);
  assert.equal(tracker.onMessage(msg(4, 7, "historical")), Verdict.DUPLICATE);
  assert.equal(tracker.onMessage(msg(11)), Verdict.DELIVER);
  assert.equal(tracker.onMessage(msg(11, 7, "snapshot")), Verdict.DUPLICATE);
  const late = allowed();
  assert.equal(late.onMessage(msg(11)), Verdict.DELIVER);
  assert.equal(late.onMessage(msg(10, 7, "snapshot")), Verdict.DUPLICATE);
  const history = allowed(position(7, 10), { history: 3 });
  assert.equal(history.onMessage(msg(8, 7, "snapshot")), Verdict.DUPLICATE);
  assert.deepEqual([8, 8, 7, 9, 10, 11].map((s) => history.onMessage(msg(s, 7, "historical"))), [
    Verdict.DELIVER, Verdict.DUPLICATE, Verdict.DUPLICATE, Verdict.DELIVER, Verdict.DELIVER,
    Verdict.DUPLICATE,
  ]);
  const resumed = allowed(); // a resume: the snapshot comes before DATA_RESYNC, not after it
  resumed.onStatus("SUBSCRIBE_ALLOW", null);
  assert.equal(resumed.onMessage(msg(30, 8, "snapshot")), Verdict.DELIVER);
  resumed.onStatus("DATA_RESYNC", position(8, 30));
  assert.equal(resumed.onMessage(msg(30, 8, "snapshot")), Verdict.DUPLICATE);
  assert.equal(resumed.onMessage(msg(31, 8)), Verdict.DELIVER);
});

test("a gap is reported once and recovered", () => {
  const tracker = allowed();
  assert.equal(tracker.onMessage(msg(13)), Verdict.GAP);
  assert.deepEqual(tracker.request().position, position(7, 10));
  assert.equal(tracker.onMessage(msg(14)), Verdict.DUPLICATE); // comes back as recovered
  tracker.onStatus("SUBSCRIBE_ALLOW", position(7, 14));
  assert.deepEqual(tracker.position, position(7, 10)); // a resume keeps its own position
  for (const seq of [11, 12, 13, 14]) assert.equal(tracker.onMessage(msg(seq, 7, "recovered")), Verdict.DELIVER);
  tracker.onStatus("DATA_SYNC", position(7, 14));
  assert.equal(tracker.recovering, false);
  assert.equal(tracker.onMessage(msg(16)), Verdict.GAP);
});

test("a conflated subscription accepts skips", () => {
  const tracker = allowed(position(7, 10), { conflationMs: 200 });
  assert.equal(tracker.onMessage(msg(15)), Verdict.DELIVER);
  assert.equal(tracker.onMessage(msg(14)), Verdict.DUPLICATE);
  assert.equal(allowed(position(7, 10), { conflationMs: 99 }).conflated, false);
});

test("a resync to a new epoch", () => {
  const tracker = allowed();
  tracker.onMessage(msg(11));
  tracker.onStatus("SUBSCRIBE_ALLOW", position(99, 3));
  assert.equal(tracker.onMessage(msg(3, 99, "snapshot")), Verdict.DELIVER);
  tracker.onStatus("DATA_RESYNC", position(99, 3));
  assert.deepEqual(tracker.position, position(99, 3));
  assert.equal(tracker.onMessage(msg(4, 99)), Verdict.DELIVER);
});

test("a sync never moves back within an epoch", () => {
  const tracker = allowed();
  tracker.onMessage(msg(11));
  tracker.onStatus("DATA_RESYNC", position(7, 9));
  assert.deepEqual(tracker.position, position(7, 11));
  assert.equal(tracker.onMessage(msg(10)), Verdict.DUPLICATE);
});

test("a message of a new epoch is accepted; a deny marks the subject", () => {
  const tracker = allowed();
  assert.equal(tracker.onMessage(msg(1, 8)), Verdict.DELIVER);
  assert.deepEqual(tracker.position, position(8, 1));
  const denied = new SubjectTracker(SUBJECT);
  denied.onStatus("SUBSCRIBE_DENY", null);
  assert.equal(denied.denied, true);
  assert.equal(denied.position, null);
});

test("a new epoch that does not start at seq 1 is a gap", () => {
  // a member that moved the subject to another lineage fans the next message out as it
  // is (Hub.apply): delivering it would skip the epoch's messages before it in silence
  const tracker = allowed();
  assert.equal(tracker.onMessage(msg(5, 8)), Verdict.GAP);
  assert.deepEqual(tracker.request().position, position(7, 10));
  assert.equal(tracker.onMessage(msg(6, 8)), Verdict.DUPLICATE); // still recovering
  tracker.onStatus("DATA_RESYNC", position(8, 6)); // the resume's answer
  assert.equal(tracker.onMessage(msg(7, 8)), Verdict.DELIVER);
  assert.deepEqual(tracker.position, position(8, 7));
});

test("a stale message of an epoch left behind is not delivered", () => {
  const tracker = allowed();
  tracker.onStatus("DATA_RESYNC", position(8, 3));
  assert.equal(tracker.onMessage(msg(11)), Verdict.GAP); // epoch 7: no flip-flop back to it
  assert.deepEqual(tracker.position, position(8, 3));
  const conflated = allowed(position(7, 10), { conflationMs: 100 });
  assert.equal(conflated.onMessage(msg(5, 8)), Verdict.DELIVER); // merged: any seq
});

test("an update before the first subscribe's answer is left", () => {
  // subscribed again just after an unsubscribe: an update the server sent for the
  // earlier subscription, before it read the unsubscribe, arrives first
  const tracker = new SubjectTracker(SUBJECT, { history: 3 });
  tracker.sent(1);
  assert.equal(tracker.onMessage(msg(11)), Verdict.DUPLICATE);
  tracker.onStatus("SUBSCRIBE_ALLOW", position(7, 11), 1);
  for (const seq of [9, 10, 11]) assert.equal(tracker.onMessage(msg(seq, 7, "historical")), Verdict.DELIVER);
  assert.equal(tracker.onMessage(msg(12)), Verdict.DELIVER);
});

test("a DATA_SYNC past messages never delivered is reported", () => {
  const tracker = allowed();
  tracker.onMessage(msg(11));
  assert.equal(tracker.onStatus("DATA_SYNC", position(7, 14)), true); // 12-14 never came
  assert.deepEqual(tracker.position, position(7, 14));
  assert.equal(tracker.onStatus("DATA_SYNC", position(7, 14)), false);
  assert.equal(tracker.onStatus("DATA_SYNC", position(7, 12)), false); // behind: nothing lost
  assert.equal(tracker.onStatus("DATA_RESYNC", position(7, 20)), false); // says so itself
  assert.equal(tracker.onStatus("DATA_SYNC", position(8, 0)), false); // a lineage, empty yet
  assert.equal(tracker.onStatus("DATA_SYNC", position(9, 3)), true);
  assert.equal(allowed(position(7, 10), { conflationMs: 100 }).onStatus("DATA_SYNC", position(7, 14)), false);
});

test("a status answering an earlier request does not move the position", () => {
  const tracker = allowed();
  tracker.sent(1);
  tracker.sent(1); // two requests out on session 1; the first answer is not the latest
  tracker.onStatus("SUBSCRIBE_ALLOW", null, 1);
  tracker.onStatus("DATA_SYNC", position(7, 20), 1);
  assert.deepEqual(tracker.position, position(7, 10));
  tracker.onStatus("SUBSCRIBE_ALLOW", null, 1);
  tracker.onStatus("DATA_SYNC", position(7, 20), 1);
  assert.deepEqual(tracker.position, position(7, 20));
});

// Property: whatever the network does (deliver, lose, replay), the application sees
// every published seq exactly once, in order.
test("a faulty stream is repaired exactly once", () => {
  const step = fc.constantFrom("live", "lose", "replay");
  fc.assert(fc.property(fc.array(step, { maxLength: 80 }), fc.integer({ min: 0, max: 5 }),
    fc.infiniteStream(fc.tuple(fc.nat(), fc.boolean())), (steps, start, picks) => {
      const epoch = 42;
      const tracker = allowed(position(epoch, start));
      let published = start;
      const delivered = [];
      const choices = picks[Symbol.iterator]();
      const feed = (message) => {
        const verdict = tracker.onMessage(message);
        if (verdict === Verdict.DELIVER) delivered.push(message.seq);
        else if (verdict === Verdict.GAP) resume(tracker.request().position);
      };
      const resume = (from) => { // the server: ALLOW, the cached messages after it, DATA_SYNC
        assert.equal(from.epoch, epoch);
        tracker.onStatus("SUBSCRIBE_ALLOW", position(epoch, published));
        for (let seq = from.seq + 1; seq <= published; seq += 1) feed(msg(seq, epoch, "recovered"));
        tracker.onStatus("DATA_SYNC", position(epoch, published));
      };
      for (const s of steps) {
        if (s === "replay" && published > start) {
          const [n, recovered] = choices.next().value;
          feed(msg(start + 1 + (n % (published - start)), epoch, recovered ? "recovered" : "update"));
          continue;
        }
        published += 1;
        if (s === "live") feed(msg(published, epoch));
      }
      tracker.onSessionLost(); // a reconnect at the end fetches whatever was lost last
      resume(tracker.request().position);
      assert.deepEqual(delivered, Array.from({ length: published - start }, (_, i) => start + 1 + i));
    }), { numRuns: 300, seed: 12 });
});

test("delivered updates strictly increase", () => {
  fc.assert(fc.property(fc.array(fc.integer({ min: 1, max: 30 }), { maxLength: 60 }),
    fc.constantFrom(0, 100), (seqs, conflationMs) => {
      const tracker = allowed(position(1, 0), { conflationMs });
      const delivered = seqs.filter((s) => tracker.onMessage(msg(s, 1)) === Verdict.DELIVER);
      assert.deepEqual(delivered, [...new Set(delivered)].sort((a, b) => a - b));
      if (!conflationMs) assert.deepEqual(delivered, delivered.map((_, i) => i + 1));
    }), { numRuns: 300, seed: 12 });
});

test("a server going back to a lineage left behind repeats nothing", () => {
  // was: 8:1 delivered, then 7:1 (a new lineage), then 8:1 again -- also a lineage
  // "from its start" -- delivered a second time
  const tracker = allowed(position(8, 0));
  assert.deepEqual([8, 7, 8].map((epoch) => tracker.onMessage(msg(1, epoch))),
    [Verdict.DELIVER, Verdict.DELIVER, Verdict.DUPLICATE]);
});

test("a status moving back to a lineage left behind keeps its highest seq", () => {
  const tracker = allowed(position(8, 5));
  tracker.onStatus("DATA_RESYNC", position(7, 3));
  tracker.onStatus("DATA_RESYNC", position(8, 0)); // was: back to 8:0
  assert.deepEqual(tracker.position, position(8, 5));
  assert.equal(tracker.onMessage(msg(1, 8)), Verdict.DUPLICATE);
});

test("a resume's snapshot at or before what was delivered is not delivered again", () => {
  // was: delivered, old state after newer (a resume's answer may hold a snapshot)
  const tracker = allowed();
  assert.equal(tracker.onMessage(msg(9, 7, "snapshot")), Verdict.DELIVER);
  tracker.onMessage(msg(11));
  tracker.onStatus("SUBSCRIBE_ALLOW", null); // a resume
  assert.equal(tracker.onMessage(msg(11, 7, "snapshot")), Verdict.DUPLICATE);
  tracker.onStatus("SUBSCRIBE_ALLOW", null);
  assert.equal(tracker.onMessage(msg(30, 7, "snapshot")), Verdict.DELIVER); // newer
  const history = allowed(position(7, 10), { history: 2 }); // never had a snapshot
  history.onMessage(msg(11));
  history.onStatus("SUBSCRIBE_ALLOW", null);
  assert.equal(history.onMessage(msg(5, 7, "snapshot")), Verdict.DELIVER);
});
