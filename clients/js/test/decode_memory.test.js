// A large batch decoded by the browser SDK: bytes counted on V8's heap after a full GC,
// not time (benchmarks/sdk_decode_memory.py --js gives the figures). Each message of a
// batch kept its own empty `fields` object and its own subject string: 308 bytes per
// small message (65 bytes on the wire), now 229.

import assert from "node:assert/strict";
import { test } from "node:test";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";

import { Encoder } from "cbor-x";

import { decodeServerOp } from "../src/codec.js";

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc");
const COUNT = 50_000;
const encoder = new Encoder({ useRecords: false, variableMapSize: true, tagUint8Array: false });
const bytes = new TextEncoder();

function batchFrame(count) {
  const messages = [];
  for (let i = 0; i < count; i += 1) {
    messages.push({ subject: "/a/b", content: bytes.encode(String(i).padStart(8, "0")),
      epoch: 123456789, seq: i + 1, type: "recovered" });
  }
  return new Uint8Array(encoder.encode({ op: "batch", messages }));
}

function heap() {
  gc();
  gc();
  return process.memoryUsage().heapUsed;
}

test("a large batch keeps less than 270 bytes per small message", () => {
  const payload = batchFrame(COUNT);
  const before = heap();
  const op = decodeServerOp(payload);
  const kept = (heap() - before) / COUNT;
  assert.equal(op.messages.length, COUNT);
  assert.ok(kept < 270, `${kept.toFixed(0)} bytes per message`); // was 308
});

test("messages without fields share one frozen fields object", () => {
  const op = decodeServerOp(batchFrame(3));
  const [first, ...rest] = op.messages;
  assert.ok(Object.isFrozen(first.fields));
  assert.deepEqual(first.fields, {});
  for (const m of rest) assert.equal(m.fields, first.fields); // was: one object each
});
