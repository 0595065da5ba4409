// Native protocol operations (docs/protocol.md): one CBOR map per binary WebSocket
// message, its "op" key naming the operation. Sans-I/O: operations in, bytes out, and
// back; no sockets, no timers. Decoding is strict: a frame that is not a valid server
// operation raises ProtocolError with the close code to answer with and a reason that
// names the offending key.

import { Decoder, Encoder } from "cbor-x";

import { CloseCode } from "./close_codes.js";
import { ProtocolError } from "./errors.js";
import { checkServerFrame } from "./frame_check.js";

export const PROTOCOL_VERSION = 1;
export const SUBPROTOCOL = "migratory.cbor";

export const MessageType = Object.freeze({
  SNAPSHOT: "snapshot",
  UPDATE: "update",
  RECOVERED: "recovered",
  HISTORICAL: "historical",
});
export const Qos = Object.freeze({ STANDARD: "standard", GUARANTEED: "guaranteed" });
/** How a SUBSCRIBE_DENY reason starts when the whole subscribe was refused because its
 * answer would not fit in the client's outbox: not a refusal of the subject, so it is
 * asked for again alone (migratory.protocol.ops.SUBSCRIBE_TOO_LARGE, docs/protocol.md). */
export const SUBSCRIBE_TOO_LARGE = "subscribe answer too large";
export const SUBJECT_STATUSES = Object.freeze([
  "DATA_SYNC", "DATA_RESYNC", "SUBSCRIBE_ALLOW", "SUBSCRIBE_DENY",
]);
export const PUBLISH_STATUSES = Object.freeze([
  "PUBLISH_OK", "PUBLISH_FAILED", "PUBLISH_DENIED", "MESSAGE_SIZE_LIMIT_EXCEEDED",
]);

const MESSAGE_TYPES = new Set(Object.values(MessageType));
const QOS_NAMES = new Set(Object.values(Qos));
const MAX_UINT32 = 0xffffffff;
const EPOCH_LIMIT = 2 ** 48;
const textDecoder = new TextDecoder("utf-8");

// Plain CBOR maps with minimal headers, byte strings untagged, 64-bit integers as numbers
// (positions stay below 2^53: epoch < 2^48).
const encoder = new Encoder({
  useRecords: false, mapsAsObjects: true, variableMapSize: true, tagUint8Array: false,
});
const decoder = new Decoder({ useRecords: false, mapsAsObjects: true, int64AsNumber: true });
// A frame with a map key `__proto__` (a field a publisher named so): decoded into Maps,
// then objects whose keys are own properties, as sent (cbor-x renames that key to
// `__proto_` when it builds an object, so the field came under another name).
const mapDecoder = new Decoder({ useRecords: false, mapsAsObjects: false, int64AsNumber: true });

/** A position `(epoch, seq)` of a subject's message. */
export function position(epoch, seq) {
  return Object.freeze({ epoch, seq });
}

/** The fields of every message that has none: one frozen object, not one per message. */
const EMPTY_FIELDS = Object.freeze({});

/** One delivered message; `content` is bytes, `text` its UTF-8 decoding. */
export class Message {
  constructor({ subject, content, fields = EMPTY_FIELDS, retained = false, qos = Qos.STANDARD,
    epoch, seq, type = MessageType.UPDATE }) {
    this.subject = subject;
    this.content = content;
    this.fields = fields === EMPTY_FIELDS ? fields : Object.freeze({ ...fields });
    this.retained = retained;
    this.qos = qos;
    this.epoch = epoch;
    this.seq = seq;
    this.type = type;
    Object.freeze(this);
  }

  get text() {
    return textDecoder.decode(this.content);
  }

  get position() {
    return position(this.epoch, this.seq);
  }
}

// --- client -> server ------------------------------------------------------------

function integer(value) {
  // cbor-x writes numbers above 2^32 as floats; the server wants integers.
  return value > MAX_UINT32 ? BigInt(value) : value;
}

function subscriptionMap({
  subject, position: from = null, history = 0, conflationMs = 0, snapshot = false,
}) {
  const body = { subject };
  if (from !== null) {
    body.epoch = integer(from.epoch);
    body.seq = integer(from.seq);
  }
  if (history) body.history = history;
  if (conflationMs) body.conflation = conflationMs;
  if (snapshot) body.snapshot = true; // a resume asking for the snapshot as of `from`
  return body;
}

/** The bytes of one client operation: {op: "connect"|"subscribe"|"unsubscribe"|
 * "publish"|"ping", ...} with the fields of docs/protocol.md in camelCase. */
export function encodeClientOp(op) {
  let body;
  switch (op.op) {
    case "connect":
      body = { op: "connect", version: op.version ?? PROTOCOL_VERSION, client: op.client ?? "" };
      if (op.token !== undefined && op.token !== null) body.token = op.token;
      // the longest silence wanted from the server, in ms (docs/protocol.md "Heartbeats")
      if (op.heartbeatMs !== undefined && op.heartbeatMs !== null) body.heartbeat = op.heartbeatMs;
      break;
    case "subscribe":
      body = { op: "subscribe", subjects: op.subscriptions.map(subscriptionMap) };
      break;
    case "unsubscribe":
      body = { op: "unsubscribe", subjects: [...op.subjects] };
      break;
    case "publish":
      body = { op: "publish", subject: op.subject, content: op.content };
      if (op.fields && Object.keys(op.fields).length) body.fields = { ...op.fields };
      if (op.retained) body.retained = true;
      if (op.qos === Qos.GUARANTEED) body.qos = Qos.GUARANTEED;
      if (op.closure !== undefined && op.closure !== null) body.closure = op.closure;
      break;
    case "ping":
      body = { op: "ping" };
      if (op.id !== undefined && op.id !== null) body.id = op.id;
      break;
    default:
      throw new TypeError(`unknown client operation ${JSON.stringify(op.op)}`);
  }
  return encoder.encode(body);
}

// --- server -> client ------------------------------------------------------------

function bad(reason) {
  return new ProtocolError(CloseCode.BAD_OPERATION, reason);
}

const isMap = (v) => v !== null && typeof v === "object" && !Array.isArray(v)
  && !(v instanceof Uint8Array);
const isInteger = (v) => typeof v === "number" && Number.isSafeInteger(v);

/** Typed access to one operation map; errors name the key. */
class Reader {
  constructor(body, where) {
    this.body = body;
    this.where = where;
  }

  get(key, check, kind, fallback) {
    if (!Object.hasOwn(this.body, key)) {
      if (fallback === REQUIRED) throw bad(`${this.where}: missing key '${key}'`);
      return fallback;
    }
    const value = this.body[key];
    if (!check(value)) throw bad(`${this.where}: key '${key}' must be ${kind}`);
    return value;
  }

  text(key, fallback = null) {
    return this.get(key, (v) => typeof v === "string", "a text string", fallback);
  }

  integer(key, fallback = null) {
    const value = this.get(key, isInteger, "an integer", fallback);
    if (value !== null && value < 0) throw bad(`${this.where}: key '${key}' must be >= 0`);
    return value;
  }

  /** An integer >= 1, or null when absent (a heartbeat's milliseconds). */
  positive(key) {
    const value = this.integer(key);
    if (value === 0) throw bad(`${this.where}: key '${key}' must be >= 1`);
    return value;
  }

  /** An epoch as a server gives them: 1 <= epoch < 2^48 (docs/protocol.md); one that
   * says 0 or more is broken, not a position to resume from. */
  epoch(fallback = null) {
    const value = this.integer("epoch", fallback);
    if (value !== null && (value < 1 || value >= EPOCH_LIMIT)) {
      throw bad(`${this.where}: key 'epoch' must be >= 1 and < 2^48`);
    }
    return value;
  }

  boolean(key, fallback) {
    return this.get(key, (v) => typeof v === "boolean", "a boolean", fallback);
  }

  bytes(key) {
    return this.get(key, (v) => v instanceof Uint8Array, "a byte string", REQUIRED);
  }

  fields(key) {
    const value = this.get(key, isMap, "a map of text to text", EMPTY_FIELDS);
    if (!Object.values(value).every((v) => typeof v === "string")) {
      throw bad(`${this.where}: key '${key}' must be a map of text to text`);
    }
    return value;
  }

  position() {
    const epoch = this.epoch();
    const seq = this.integer("seq");
    if ((epoch === null) !== (seq === null)) {
      throw bad(`${this.where}: 'epoch' and 'seq' must be given together`);
    }
    return epoch === null ? null : position(epoch, seq);
  }
}
const REQUIRED = Symbol("required");

function decodeMessage(item, subjects = null) {
  if (!isMap(item)) throw bad("message: expected a map");
  const r = new Reader(item, "message");
  const type = r.text("type", MessageType.UPDATE);
  const qos = r.text("qos", Qos.STANDARD);
  if (!MESSAGE_TYPES.has(type) || !QOS_NAMES.has(qos)) {
    throw bad(`message: unknown type '${type}' or qos '${qos}'`);
  }
  let subject = r.text("subject", REQUIRED);
  if (subjects !== null) { // one string per subject of a batch, not one per message
    const known = subjects.get(subject);
    if (known === undefined) subjects.set(subject, subject);
    else subject = known;
  }
  return new Message({
    subject,
    content: r.bytes("content"),
    fields: r.fields("fields"),
    retained: r.boolean("retained", false),
    qos,
    epoch: r.epoch(REQUIRED),
    seq: r.integer("seq", REQUIRED),
    type,
  });
}

function status(r, allowed) {
  const name = r.text("status", REQUIRED);
  if (!allowed.includes(name)) throw bad(`${r.where}: unknown status '${name}'`);
  return name;
}

/** `item` with every Map made an object holding its keys as own properties (a key
 * `__proto__` too: Object.fromEntries defines it, where `object[key] = value` would set
 * the object's prototype). The keys are text: checkServerFrame saw to it. */
function withObjects(item) {
  if (item instanceof Map) {
    return Object.fromEntries([...item].map(([key, value]) => [key, withObjects(value)]));
  }
  return Array.isArray(item) ? item.map(withObjects) : item;
}

function loadMap(payload) {
  let item;
  const proto = checkServerFrame(payload);
  try {
    item = proto ? withObjects(mapDecoder.decode(payload)) : decoder.decode(payload);
  } catch (error) {
    throw new ProtocolError(CloseCode.INVALID_PAYLOAD, `not a CBOR item: ${error.message}`);
  }
  if (!isMap(item)) throw bad(`expected a CBOR map, got ${Array.isArray(item) ? "an array" : typeof item}`);
  return item;
}

/** Decode one server frame payload (Uint8Array or ArrayBuffer) into an operation:
 * {op: "connected", server, version, maxSubjectsPerSubscribe} | {op: "deliver", messages: Message[]} |
 * {op: "status", status, subject, position, reason} |
 * {op: "publish_status", status, subject, closure, position, reason} | {op: "pong", id} |
 * {op: "unknown", name}: an op of no protocol version this client speaks, which the
 * session ignores (migratory.protocol.ops.SERVER_OPS_BY_VERSION: a server sends only the
 * operations of the version it answered `connect` with). Throws ProtocolError for a
 * frame that is no operation, or a known one that is malformed. */
export function decodeServerOp(payload) {
  const body = loadMap(payload instanceof Uint8Array ? payload : new Uint8Array(payload));
  const name = body.op;
  if (typeof name !== "string") throw bad("missing text key 'op'");
  const r = new Reader(body, name);
  switch (name) {
    case "message":
      return Object.freeze({ op: "deliver", messages: Object.freeze([decodeMessage(body)]) });
    case "batch": {
      const items = r.get("messages", Array.isArray, "an array", REQUIRED);
      const subjects = new Map();
      const messages = items.map((item) => decodeMessage(item, subjects));
      return Object.freeze({ op: "deliver", messages: Object.freeze(messages) });
    }
    case "status":
      return Object.freeze({
        op: "status", status: status(r, SUBJECT_STATUSES), subject: r.text("subject", REQUIRED),
        position: r.position(), reason: r.text("reason"),
      });
    case "publish_status":
      return Object.freeze({
        op: "publish_status", status: status(r, PUBLISH_STATUSES),
        closure: r.text("closure"), subject: r.text("subject", REQUIRED),
        position: r.position(), reason: r.text("reason"),
      });
    case "connected":
      return Object.freeze({
        op: "connected", server: r.text("server", ""), version: r.integer("version", 1),
        maxSubjectsPerSubscribe: r.integer("max_subjects_per_subscribe"),
        heartbeatMs: r.positive("heartbeat"),
      });
    case "pong":
      return Object.freeze({ op: "pong", id: r.integer("id") });
    default: // of no version this client speaks: ignored (SERVER_OPS_BY_VERSION)
      return Object.freeze({ op: "unknown", name: name.slice(0, 40) });
  }
}
