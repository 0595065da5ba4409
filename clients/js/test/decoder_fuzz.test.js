// fast-check against decodeServerOp: a known server operation with one key changed to
// any kind of value, cut short, or with bytes after it, decodes to a well-typed
// operation or throws ProtocolError (the session then closes and reconnects) -- never
// another error, never a message with content that is not bytes or a position that is
// not a non-negative safe integer. (The Python SDK's tests/client/test_sdk_decoder_fuzz.py
// plays the same frames at a whole client.)

import assert from "node:assert/strict";
import { test } from "node:test";

import { Encoder } from "cbor-x";
import fc from "fast-check";

import { decodeServerOp } from "../src/codec.js";
import { ProtocolError } from "../src/errors.js";

const encoder = new Encoder({ useRecords: false, variableMapSize: true, tagUint8Array: false });
const MESSAGE = { subject: "/a/b", content: new Uint8Array([1]), epoch: 7, seq: 11, type: "update" };
const OPERATIONS = [
  { op: "message", ...MESSAGE, fields: { a: "b" } },
  { op: "batch", messages: [MESSAGE] },
  { op: "status", status: "DATA_SYNC", subject: "/a/b", epoch: 7, seq: 3 },
  { op: "publish_status", status: "PUBLISH_OK", subject: "/a/b", closure: "c", epoch: 7, seq: 3 },
  { op: "connected", server: "s", version: 1 },
  { op: "pong", id: 3 },
];
const KEYS = ["op", "subject", "content", "epoch", "seq", "type", "fields", "status", "closure",
  "server", "version", "id", "messages", "retained", "qos", "unknown"];
const VALUE = fc.oneof(
  fc.constant(null), fc.boolean(), fc.integer(), fc.double(),
  fc.bigInt({ min: -(2n ** 70n), max: 2n ** 70n }), fc.string({ maxLength: 4 }),
  fc.uint8Array({ maxLength: 4 }), fc.array(fc.integer(), { maxLength: 2 }),
  fc.dictionary(fc.string({ maxLength: 3 }), fc.oneof(fc.integer(), fc.string())),
);

function payloadOf(base, key, value, cut, kind) {
  const body = { ...base };
  if (base.op === "batch" && key !== "messages") body.messages = [{ ...MESSAGE, [key]: value }];
  else body[key] = value;
  const whole = encoder.encode(body);
  if (kind === "cut") return whole.subarray(0, cut % whole.length);
  if (kind === "trailing") return Buffer.concat([whole, Buffer.from([cut & 0xff])]);
  return whole;
}

test("a changed, cut or extended server frame is a typed operation or a ProtocolError", () => {
  fc.assert(fc.property(
    fc.constantFrom(...OPERATIONS), fc.constantFrom(...KEYS), VALUE, fc.nat(),
    fc.constantFrom("changed", "cut", "trailing"),
    (base, key, value, cut, kind) => {
      let op;
      try {
        op = decodeServerOp(payloadOf(base, key, value, cut, kind));
      } catch (error) {
        assert.ok(error instanceof ProtocolError, String(error));
        return;
      }
      assert.notEqual(kind, "trailing"); // bytes after the map are never read past
      for (const message of op.op === "deliver" ? op.messages : []) {
        assert.ok(message.content instanceof Uint8Array);
        assert.ok(Number.isSafeInteger(message.seq) && message.seq >= 0);
        assert.ok(Number.isSafeInteger(message.epoch) && message.epoch >= 0);
        assert.equal(typeof message.subject, "string");
        assert.ok(Object.values(message.fields).every((v) => typeof v === "string"));
      }
    },
  ), { numRuns: 3000 });
});
