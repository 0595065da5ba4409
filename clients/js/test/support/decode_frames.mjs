// Decodes server frames with the SDK's decodeServerOp and says, one JSON line per frame,
// what came of each: {"op": ...} (the operation, bytes as {"bytes": length}, a message's
// fields with whether they are own properties of a plain object), {"refused": closeCode,
// "reason": ...} for a ProtocolError, {"crash": ...} for any other error. Frames come on
// stdin, each a 4-byte big-endian length and its payload. Run by
// tests/client/test_js_decoder_fuzz.py (which feeds it frames a hostile server writes).

import { decodeServerOp } from "../../src/codec.js";
import { ProtocolError } from "../../src/errors.js";

function fieldsOf(fields) {
  return {
    plain: Object.getPrototypeOf(fields) === Object.prototype && Object.isFrozen(fields),
    entries: Object.keys(fields).map((key) => [key, fields[key]]),
  };
}

function messageOf(m) {
  return {
    subject: m.subject,
    bytes: m.content instanceof Uint8Array ? m.content.length : null,
    fields: fieldsOf(m.fields),
    retained: m.retained,
    qos: m.qos,
    epoch: m.epoch,
    seq: m.seq,
    type: m.type,
  };
}

function describe(op) {
  if (op.op === "deliver") return { op: "deliver", messages: op.messages.map(messageOf) };
  return op;
}

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const input = Buffer.concat(chunks);
const lines = [];
for (let at = 0; at < input.length;) {
  const size = input.readUInt32BE(at);
  const payload = new Uint8Array(input.subarray(at + 4, at + 4 + size));
  at += 4 + size;
  let line;
  try {
    line = describe(decodeServerOp(payload));
  } catch (error) {
    line = error instanceof ProtocolError
      ? { refused: error.closeCode, reason: error.reason }
      : { crash: `${error?.name}: ${error?.message}` };
  }
  lines.push(JSON.stringify(line));
}
process.stdout.write(`${lines.join("\n")}\n`);
