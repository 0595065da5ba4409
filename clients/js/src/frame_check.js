// What a server's frame may hold, checked from its bytes before cbor-x decodes it.
// Sans-I/O. A server writes plain CBOR (cbor2 and migratory/protocol/cbor_splice.py):
// one map; definite lengths; text keys; integers, byte and UTF-8 text strings, arrays,
// maps, false, true, null; no tags. cbor-x decodes much more, and some of it would mislead the
// client rather than fail: a shared reference (tags 28/29) makes two places of a frame
// one object, tag 259 turns a `fields` map into a Map that reads as no fields at all,
// tag 27 builds an Error or a RegExp from the frame, record tags define key lists that
// later frames of the same decoder reuse, a packed-value table changes what later
// simple values mean. None comes from a server: a frame holding one is refused (1007)
// like any frame that is not CBOR. The check also bounds nesting (as the server does a
// client's frames) and says whether a map key is `__proto__`, which cbor-x renames when
// it builds an object (codec.js then decodes that frame into Maps, see loadMap).

import { CloseCode } from "./close_codes.js";
import { ProtocolError } from "./errors.js";

/** Nesting a server's operation needs: the operation map, the batch's array, a
 * message map, its fields map (the Python SDK and the server allow 8). */
export const MAX_DEPTH = 8;

const PROTO = [0x5f, 0x5f, 0x70, 0x72, 0x6f, 0x74, 0x6f, 0x5f, 0x5f]; // "__proto__"
const strictUtf8 = new TextDecoder("utf-8", { fatal: true });

/** Whether bytes[start, start + length) are UTF-8 (what a server's text always is;
 * cbor-x would read other bytes as U+FFFD, a subject or a field that was never sent). */
function isUtf8(bytes, start, length) {
  for (let i = start; i < start + length; i += 1) {
    if (bytes[i] >= 0x80) { // (ASCII needs no decoder)
      try {
        strictUtf8.decode(bytes.subarray(start, start + length));
        return true;
      } catch {
        return false;
      }
    }
  }
  return true;
}

function refuse(reason) {
  return new ProtocolError(CloseCode.INVALID_PAYLOAD, `not a CBOR item: ${reason}`);
}

function isProto(bytes, start, length) {
  if (length !== PROTO.length) return false;
  for (let i = 0; i < length; i += 1) if (bytes[start + i] !== PROTO[i]) return false;
  return true;
}

/** Check `bytes` (a Uint8Array) holds one CBOR item of the kinds a server sends and
 * nothing after it; throws ProtocolError (1007) naming what is wrong. Returns whether
 * a map key of it is `__proto__`. */
export function checkServerFrame(bytes) {
  const end = bytes.length;
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  // per open array or map: items still to read, and whether it is a map
  const left = [];
  const inMap = [];
  let pos = 0;
  let proto = false;
  let items = 1; // items to read at the top level
  for (;;) {
    while (items === 0) {
      if (left.length === 0) {
        if (pos !== end) throw refuse(`${end - pos} bytes after the item`);
        return proto;
      }
      items = left.pop();
      inMap.pop();
    }
    if (pos >= end) throw refuse("the frame ends inside an item");
    const atKey = inMap.length > 0 && inMap[inMap.length - 1] && items % 2 === 0;
    items -= 1;
    const head = bytes[pos];
    pos += 1;
    const major = head >> 5;
    const info = head & 0x1f;
    if (major === 6) throw refuse(`CBOR tag at byte ${pos - 1} (a server sends none)`);
    if (atKey && major !== 3) throw refuse(`a map key at byte ${pos - 1} is not a text string`);
    if (major === 7) {
      if (info >= 20 && info <= 22) continue; // false, true, null
      if (info >= 25 && info <= 27) { // a float (a key that wants an integer refuses it)
        pos += 1 << (info - 24);
        if (pos > end) throw refuse("the frame ends inside an item");
        continue;
      }
      throw refuse(`simple value ${info} at byte ${pos - 1} (a server sends none)`);
    }
    let argument;
    if (info < 24) {
      argument = info;
    } else if (info <= 27) {
      const size = 1 << (info - 24);
      if (pos + size > end) throw refuse("the frame ends inside an item");
      if (size === 1) argument = bytes[pos];
      else if (size === 2) argument = view.getUint16(pos);
      else if (size === 4) argument = view.getUint32(pos);
      else argument = view.getUint32(pos) * 2 ** 32 + view.getUint32(pos + 4);
      pos += size;
    } else {
      throw refuse(`${info === 31 ? "an indefinite length" : "a reserved head"} at byte ${pos - 1}`);
    }
    if (major === 2 || major === 3) {
      if (argument > end - pos) throw refuse("the frame ends inside a string");
      if (atKey && isProto(bytes, pos, argument)) proto = true;
      if (major === 3 && !isUtf8(bytes, pos, argument)) {
        throw refuse(`the text string at byte ${pos} is not UTF-8`);
      }
      pos += argument;
    } else if (major === 4 || major === 5) {
      const count = major === 5 ? argument * 2 : argument;
      if (count > end - pos) throw refuse("the frame ends inside an array or map"); // 1 byte each at least
      if (left.length + 1 > MAX_DEPTH) throw refuse(`nesting deeper than ${MAX_DEPTH}`);
      left.push(items);
      inMap.push(major === 5);
      items = count;
    }
  }
}
