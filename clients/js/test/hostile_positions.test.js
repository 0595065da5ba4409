// Positions from a hostile server, through the router as a session feeds it: whatever
// order of subscribe answers, DATA_SYNC / DATA_RESYNC (with any position, twice, early),
// messages of any epoch, seq and type, and lost sessions, the application never gets a
// message twice, out of order, or after a gap unless a DATA_RESYNC told it so. (The
// Python SDK's tests/client/test_sdk_hostile_positions.py.)

import assert from "node:assert/strict";
import { test } from "node:test";

import fc from "fast-check";

import { Message, SubjectTracker, position } from "../src/index.js";
import { Router } from "../src/router.js";

const SUBJECT = "/a/b";
const TYPES = ["update", "recovered", "snapshot", "historical"];

const step = fc.oneof(
  fc.tuple(fc.constant("message"), fc.constantFrom(7, 8), fc.integer({ min: 0, max: 3 }),
    fc.constantFrom(...TYPES)),
  fc.tuple(fc.constant("status"), fc.constantFrom("SUBSCRIBE_ALLOW", "DATA_SYNC", "DATA_RESYNC"),
    fc.option(fc.tuple(fc.constantFrom(7, 8), fc.integer({ min: 0, max: 3 })))),
  fc.tuple(fc.constant("lost")),
);

/** What the application gets, in order, from the router fed `script`. */
function played(script, history) {
  const got = [];
  const router = new Router((note) => got.push(note));
  const outlet = { paused: false, full: () => false, push: (m) => got.push(m), end: () => {} };
  router.add([new SubjectTracker(SUBJECT, { history })], outlet);
  let session = 1;
  router.sent(session, router.requestsFor(session));
  for (const [kind, a, b, c] of script) {
    if (kind === "message") {
      const message = new Message({ subject: SUBJECT, content: new Uint8Array(1), epoch: a, seq: b, type: c });
      router.sent(session, router.onMessages([message]).resubscribe);
    } else if (kind === "status") {
      const at = b === null ? null : position(b[0], b[1]);
      const op = { op: "status", status: a, subject: SUBJECT, position: at, reason: null };
      router.sent(session, router.onSubjectStatus(op, "ws://s", session));
    } else {
      router.sessionLost("cut");
      session += 1;
      router.sent(session, router.requestsFor(session));
    }
  }
  return got;
}

test("no duplicate, gap or disorder without a DATA_RESYNC", () => {
  fc.assert(fc.property(fc.array(step, { maxLength: 25 }), fc.constantFrom(0, 2), (script, history) => {
    let last = null;
    const seen = new Set();
    let resynced = false;
    for (const item of played(script, history)) {
      if (!(item instanceof Message)) {
        resynced = resynced || item.status === "DATA_RESYNC";
        continue;
      }
      if (item.type === "snapshot" || item.type === "historical") continue;
      const at = `${item.epoch}:${item.seq}`;
      if (!resynced) {
        assert.ok(!seen.has(at), `${at} twice`);
        if (last !== null && last.epoch === item.epoch) {
          assert.equal(item.seq, last.seq + 1, `${at} after ${last.epoch}:${last.seq}`);
        } else if (last !== null) {
          assert.equal(item.seq, 1, `${at} after ${last.epoch}:${last.seq}: a lineage entered in its middle`);
        }
      }
      seen.add(at);
      last = item;
      resynced = false;
    }
  }), { numRuns: 1000 });
});
