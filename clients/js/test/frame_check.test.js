// What a server never sends is refused, not decoded into something else (src/frame_check.js):
// CBOR tags (shared references, a Map, an Error or RegExp built from the frame, records),
// simple values other than false/true/null, indefinite lengths, map keys that are not
// text, text that is not UTF-8, nesting past MAX_DEPTH, an epoch outside 1 to 2^48 - 1. And a field a publisher
// named `__proto__` or `constructor` arrives under its own name, as an own property,
// without touching any prototype.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Encoder, Tag } from "cbor-x";

import { decodeServerOp } from "../src/codec.js";
import { ProtocolError } from "../src/errors.js";
import { MAX_DEPTH, checkServerFrame } from "../src/frame_check.js";

const raw = new Encoder({ useRecords: false, variableMapSize: true, tagUint8Array: false });
/** Maps keep every key as given (an object literal would make `__proto__` its prototype). */
const maps = new Encoder({ useRecords: false, mapsAsObjects: false, variableMapSize: true,
  tagUint8Array: false });
const CONTENT = new Uint8Array([1]);
const MESSAGE = { subject: "/a/b", content: CONTENT, epoch: 7, seq: 1 };

function refused(payload, closeCode, reasonPart) {
  assert.throws(() => decodeServerOp(payload), (error) => {
    assert.ok(error instanceof ProtocolError, String(error));
    assert.equal(error.closeCode, closeCode);
    assert.match(error.reason, reasonPart);
    return true;
  });
}

const TAGGED = {
  // was: two messages of one batch the same object, decoded
  "a shared value and a reference to it (tags 28, 29)": raw.encode({ op: "batch", messages: [
    new Tag(MESSAGE, 28), new Tag(0, 29)] }),
  // was: the fields a Map, read as no fields at all: the message delivered without them
  "fields as a Map (tag 259)": raw.encode({ op: "message", ...MESSAGE,
    fields: new Tag({ k: "v" }, 259) }),
  // was: an Error or a RegExp built from the frame, in a key nobody reads
  "a RegExp built from the frame (tag 27)": raw.encode({ op: "pong", id: 1,
    later: new Tag(["RegExp", "(a+)+$"], 27) }),
  "a date (tag 1) in a key nobody reads": raw.encode({ op: "pong", id: 1, when: new Tag(0, 1) }),
  // was: decoded as {op: "pong", id: 1}, its key list kept by the decoder for later frames
  "a record": new Encoder({ useRecords: true }).encode({ op: "pong", id: 1 }),
};

for (const [name, payload] of Object.entries(TAGGED)) {
  test(`a frame with ${name} is refused (1007): a server sends no CBOR tag`, () => {
    refused(payload, 1007, /not a CBOR item: CBOR tag at byte \d+/);
  });
}

test("what else a server never writes is refused (1007), saying what it is", () => {
  const pong = raw.encode({ op: "pong" }); // a2 62 6f70 64 706f6e67
  refused(raw.encode({ op: "pong", id: 1, x: undefined }), 1007, /simple value 23/);
  refused(Uint8Array.of(0xbf, ...pong.subarray(1), 0xff), 1007, /an indefinite length/);
  refused(Uint8Array.of(0xa2, ...pong.subarray(1), 0x01, 0x01), 1007,
    /a map key at byte 9 is not a text string/); // was: key 1 read as "1"
  refused(Uint8Array.of(0x1c), 1007, /a reserved head/);
  // was: read as U+FFFD, a subject or a field value no server sent (the Python SDK refuses)
  const subject = Uint8Array.of(0x64, 0x2f, 0x61, 0x2f, 0xff); // "/a/" and a byte of no UTF-8
  const ok = raw.encode({ op: "status", status: "DATA_SYNC", subject: "/a/b" });
  const at = ok.indexOf(0x64, ok.length - 5);
  refused(Uint8Array.of(...ok.subarray(0, at), ...subject), 1007,
    /the text string at byte \d+ is not UTF-8/);
  refused(raw.encode({ op: "status", status: "DATA_SYNC", subject: "/a/\ud800" }), 1007,
    /is not UTF-8/); // a lone surrogate, as cbor-x writes it
  assert.equal(decodeServerOp(raw.encode({ op: "status", status: "DATA_SYNC",
    subject: "/ä/€/😀" })).subject, "/ä/€/😀");
  let deep = 0;
  for (let i = 0; i < MAX_DEPTH; i += 1) deep = [deep];
  refused(raw.encode({ op: "pong", x: deep }), 1007, /nesting deeper than 8/);
  assert.equal(checkServerFrame(raw.encode({ op: "pong", x: deep[0] })), false);
});

test("what a server writes passes the check: floats too (a key wanting an integer refuses them)", () => {
  for (const body of [
    { op: "message", ...MESSAGE, fields: { a: "b" }, retained: true, qos: "guaranteed" },
    { op: "batch", messages: [MESSAGE, { ...MESSAGE, seq: 2 ** 40 }] },
    { op: "status", status: "DATA_RESYNC", subject: "/a/b", reason: "r" },
    { op: "connected", server: "s".repeat(300), version: 1 },
  ]) {
    assert.equal(checkServerFrame(raw.encode(body)), false);
    assert.doesNotThrow(() => decodeServerOp(raw.encode(body)));
  }
  refused(raw.encode({ op: "pong", id: 1.5 }), 4000, /key 'id' must be an integer/);
});

test("a field named __proto__, constructor or hasOwnProperty is delivered as sent, polluting nothing", () => {
  const fields = new Map([["__proto__", "x"], ["__proto_", "y"], ["constructor", "c"],
    ["hasOwnProperty", "h"], ["toString", "t"]]);
  const payload = maps.encode(new Map([["op", "message"], ["subject", "/a/b"],
    ["content", CONTENT], ["fields", fields], ["epoch", 7], ["seq", 1]]));
  assert.equal(checkServerFrame(payload), true);
  const [message] = decodeServerOp(payload).messages;
  // was: ["__proto_", "constructor", ...]: the field __proto__ renamed, then lost to __proto_
  assert.deepEqual(Object.keys(message.fields),
    ["__proto__", "__proto_", "constructor", "hasOwnProperty", "toString"]);
  assert.ok(Object.hasOwn(message.fields, "__proto__"));
  assert.equal(message.fields.__proto__, "x");
  assert.equal(message.fields.constructor, "c");
  assert.equal(Object.getPrototypeOf(message.fields), Object.prototype);
  assert.equal(JSON.stringify(message.fields),
    '{"__proto__":"x","__proto_":"y","constructor":"c","hasOwnProperty":"h","toString":"t"}');
  assert.equal({}.x, undefined);
  assert.equal(typeof {}.hasOwnProperty, "function");
});

test("a __proto__ key that is a map is a field of the wrong kind, and pollutes nothing", () => {
  const payload = maps.encode(new Map([["op", "message"], ["subject", "/a/b"],
    ["content", CONTENT], ["fields", new Map([["__proto__", new Map([["polluted", "yes"]])]])],
    ["epoch", 7], ["seq", 1]]));
  refused(payload, 4000, /key 'fields' must be a map of text to text/);
  const top = maps.encode(new Map([["op", "pong"], ["id", 1],
    ["__proto__", new Map([["polluted", "yes"]])]]));
  assert.deepEqual(decodeServerOp(top), { op: "pong", id: 1 });
  assert.equal({}.polluted, undefined);
});

test("an epoch a server never gives (0, 2^48 and above) is refused (4000)", () => {
  // was: taken as a position (a message at epoch 0 delivered, a status moving to it)
  refused(raw.encode({ op: "message", ...MESSAGE, epoch: 0 }), 4000,
    /message: key 'epoch' must be >= 1 and < 2\^48/);
  refused(raw.encode({ op: "batch", messages: [{ ...MESSAGE, epoch: 2 ** 48 }] }), 4000,
    /message: key 'epoch' must be >= 1/);
  refused(raw.encode({ op: "status", status: "DATA_SYNC", subject: "/a/b", epoch: 0, seq: 3 }),
    4000, /status: key 'epoch' must be >= 1/);
  refused(raw.encode({ op: "publish_status", status: "PUBLISH_OK", subject: "/a/b", closure: "c",
    epoch: 0, seq: 3 }), 4000, /publish_status: key 'epoch' must be >= 1/);
  const edge = decodeServerOp(raw.encode({ op: "message", ...MESSAGE, epoch: 2 ** 48 - 1 }));
  assert.equal(edge.messages[0].epoch, 2 ** 48 - 1);
});
