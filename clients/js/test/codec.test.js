import assert from "node:assert/strict";
import { test } from "node:test";

import { Encoder, decode } from "cbor-x";

import {
  CloseCode, Message, ProtocolError, decodeServerOp, encodeClientOp, position, shouldReconnect,
} from "../src/index.js";
import { protocolExamples } from "./support/protocol_doc.js";

const bytes = (s) => new TextEncoder().encode(s);

// What this client encodes for each client example of docs/protocol.md.
const CLIENT_OPS = {
  "connect": { op: "connect", client: "ticker", token: "t0k3n" },
  "subscribe (fresh with conflation; resume from a position)": {
    op: "subscribe",
    subscriptions: [
      { subject: "/Stocks/NYSE/IBM", position: null, history: 0, conflationMs: 500 },
      { subject: "/Scores/NBA/LAL", position: position(1000003, 41) },
    ],
  },
  "subscribe with history": {
    op: "subscribe", subscriptions: [{ subject: "/Stocks/NYSE/IBM", history: 10 }],
  },
  "publish with closure": {
    op: "publish", subject: "/Stocks/NYSE/IBM", content: bytes("193"),
    fields: { volume: "6.62M" }, retained: true, qos: "standard", closure: "p-1",
  },
  "unsubscribe": { op: "unsubscribe", subjects: ["/Stocks/NYSE/IBM"] },
  "ping": { op: "ping", id: 7 },
};

const msg = (o) => new Message(o);
// What this client decodes from each server example.
const SERVER_OPS = {
  "connected": { op: "connected", server: "migratory", version: 1, maxSubjectsPerSubscribe: null,
    heartbeatMs: null },
  "SUBSCRIBE_ALLOW (fresh subscribe)": {
    op: "status", status: "SUBSCRIBE_ALLOW", subject: "/Stocks/NYSE/IBM",
    position: position(1000003, 42), reason: null,
  },
  "message (snapshot)": { op: "deliver", messages: [msg({
    subject: "/Stocks/NYSE/IBM", content: bytes("193"), fields: { volume: "6.62M" },
    retained: true, epoch: 1000003, seq: 42, type: "snapshot",
  })] },
  "message (update)": { op: "deliver", messages: [msg({
    subject: "/Stocks/NYSE/IBM", content: bytes("194"), epoch: 1000003, seq: 43, type: "update",
  })] },
  "batch (recovered)": { op: "deliver", messages: [
    msg({ subject: "/Scores/NBA/LAL", content: bytes("88"), epoch: 1000003, seq: 42, type: "recovered" }),
    msg({ subject: "/Scores/NBA/LAL", content: bytes("90"), epoch: 1000003, seq: 43, type: "recovered" }),
  ] },
  "DATA_SYNC": {
    op: "status", status: "DATA_SYNC", subject: "/Scores/NBA/LAL",
    position: position(1000003, 43), reason: null,
  },
  "SUBSCRIBE_DENY": {
    op: "status", status: "SUBSCRIBE_DENY", subject: "/Stocks", position: null,
    reason: "has only one segment (two or more are required)",
  },
  "PUBLISH_OK": {
    op: "publish_status", status: "PUBLISH_OK", closure: "p-1", subject: "/Stocks/NYSE/IBM",
    position: position(1000003, 44), reason: null,
  },
  "PUBLISH_DENIED": {
    op: "publish_status", status: "PUBLISH_DENIED", closure: "p-2", subject: "/Stocks/NYSE/IBM",
    position: null, reason: "not entitled to publish",
  },
  "pong": { op: "pong", id: 7 },
};

const plain = (op) => JSON.parse(JSON.stringify(op, (k, v) => (v instanceof Uint8Array ? [...v] : v)));

const operations = () => protocolExamples().filter((e) => e.opcode === 2);

test("every example of docs/protocol.md is covered", () => {
  const examples = operations();
  assert.equal(examples.length, 16);
  const titles = (d) => examples.filter((e) => e.direction === d).map((e) => e.title).sort();
  assert.deepEqual(titles("client"), Object.keys(CLIENT_OPS).sort());
  assert.deepEqual(titles("server"), Object.keys(SERVER_OPS).sort());
});

test("client operations encode to the documented bytes exactly", () => {
  for (const example of operations().filter((e) => e.direction === "client")) {
    const encoded = encodeClientOp(CLIENT_OPS[example.title]);
    assert.deepEqual([...encoded], [...example.payload], example.title);
  }
});

test("server operations decode from the documented bytes", () => {
  for (const example of operations().filter((e) => e.direction === "server")) {
    const op = decodeServerOp(example.payload);
    assert.deepEqual(plain(op), plain(SERVER_OPS[example.title]), example.title);
    assert.ok(Object.isFrozen(op), example.title);
  }
  const example = operations().find((e) => e.title === "message (snapshot)");
  const [snapshot] = decodeServerOp(example.payload).messages;
  assert.equal(snapshot.text, "193");
});

test("the documented close frame carries a code of the shared table that asks to reconnect", () => {
  const closes = protocolExamples().filter((e) => e.opcode === 8);
  assert.deepEqual(closes.map((e) => e.title), ["close 4500 SLOW_CONSUMER"]);
  const { payload } = closes[0];
  const code = (payload[0] << 8) | payload[1];
  assert.equal(code, CloseCode.SLOW_CONSUMER);
  assert.equal(new TextDecoder().decode(payload.subarray(2)), "slow consumer");
  assert.equal(shouldReconnect(code), true);
});

test("decoding also takes an ArrayBuffer (what a browser WebSocket hands over)", () => {
  const example = protocolExamples().find((e) => e.title === "PUBLISH_OK");
  const copy = example.payload.slice();
  assert.equal(decodeServerOp(copy.buffer).position.seq, 44);
});

test("positions above 2^32 are written as CBOR integers, not floats", () => {
  const epoch = 2 ** 48 - 1;
  const payload = encodeClientOp({
    op: "subscribe", subscriptions: [{ subject: "/a/b", position: position(epoch, 2 ** 33) }],
  });
  const body = decode(payload);
  assert.equal(typeof body.subjects[0].epoch, "bigint");
  assert.equal(body.subjects[0].epoch, BigInt(epoch));
  assert.equal(body.subjects[0].seq, 2n ** 33n);
  assert.ok(!payload.includes(0xfb), "no float64 in the payload");
});

function rejects(payload, closeCode, reasonPart) {
  assert.throws(() => decodeServerOp(payload), (error) => {
    assert.ok(error instanceof ProtocolError, String(error));
    assert.equal(error.closeCode, closeCode);
    assert.match(error.reason, reasonPart);
    return true;
  });
}

const raw = new Encoder({ useRecords: false, variableMapSize: true, tagUint8Array: false });

test("an op of no protocol version it knows decodes as unknown, not as an error", () => {
  // was: ProtocolError "unknown op 'unsubscribe'", and the session closed over it
  assert.deepEqual(decodeServerOp(raw.encode({ op: "unsubscribe", subjects: ["/a/b"] })),
    { op: "unknown", name: "unsubscribe" });
  assert.deepEqual(decodeServerOp(raw.encode({ op: "x".repeat(1000) })),
    { op: "unknown", name: "x".repeat(40) });
  rejects(raw.encode({ op: "batch", messages: "no" }), 4000, /batch: key 'messages'/);
});

test("bad frames are ProtocolErrors with the close code and a reason naming the key", () => {
  rejects(Uint8Array.of(0xa2, 0x62), 1007, /not a CBOR item/);
  rejects(Uint8Array.of(0x83, 1, 2, 3), 4000, /expected a CBOR map, got an array/);
  rejects(raw.encode({ kind: "pong" }), 4000, /missing text key 'op'/);
  rejects(raw.encode({ op: "status", status: "DATA_SYNC", subject: 5 }), 4000,
    /status: key 'subject' must be a text string/);
  rejects(raw.encode({ op: "status", status: "PUBLISH_OK", subject: "/a/b" }), 4000,
    /unknown status 'PUBLISH_OK'/);
  rejects(raw.encode({ op: "status", status: "DATA_SYNC", subject: "/a/b", epoch: 3 }), 4000,
    /'epoch' and 'seq' must be given together/);
  rejects(raw.encode({ op: "message", subject: "/a/b", content: "text", epoch: 1, seq: 1 }), 4000,
    /message: key 'content' must be a byte string/);
  rejects(raw.encode({ op: "message", subject: "/a/b", content: bytes("x"), epoch: 1 }), 4000,
    /message: missing key 'seq'/);
  rejects(raw.encode({ op: "message", subject: "/a/b", content: bytes("x"), epoch: 1, seq: -2 }),
    4000, /key 'seq' must be >= 0/);
  rejects(raw.encode({ op: "message", subject: "/a/b", content: bytes("x"), epoch: 1, seq: 2,
    fields: { k: 1 } }), 4000, /key 'fields' must be a map of text to text/);
  rejects(raw.encode({ op: "batch", messages: [{ subject: "/a/b", content: bytes("x"), epoch: 1,
    seq: 2, type: "live" }] }), 4000, /unknown type 'live'/);
});

test("a frame is exactly one CBOR item: trailing bytes are refused", () => {
  const example = protocolExamples().find((e) => e.title === "pong");
  const longer = Uint8Array.of(...example.payload, 0x00);
  rejects(longer, 1007, /not a CBOR item/);
});

test("truncated frames are refused whole, one byte short at a time", () => {
  const example = protocolExamples().find((e) => e.title === "batch (recovered)");
  for (let cut = 1; cut < example.payload.length; cut += 1) {
    assert.throws(() => decodeServerOp(example.payload.subarray(0, cut)), ProtocolError, `cut ${cut}`);
  }
});
