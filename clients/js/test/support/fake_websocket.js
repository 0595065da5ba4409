// A WebSocket stand-in for the client tests: the test plays the server, frame by frame.

import { Decoder, Encoder } from "cbor-x";

const encoder = new Encoder({ useRecords: false, variableMapSize: true, tagUint8Array: false });
const decoder = new Decoder({ useRecords: false, mapsAsObjects: true, int64AsNumber: true });

export class FakeWebSocket {
  static instances = [];

  constructor(url, protocols) {
    this.url = url;
    this.protocols = protocols;
    this.readyState = 0;
    this.sent = [];
    this.closedWith = null;
    FakeWebSocket.instances.push(this);
  }

  static reset() {
    FakeWebSocket.instances = [];
  }

  static last() {
    return FakeWebSocket.instances.at(-1);
  }

  // --- what the client calls ---
  send(bytes) {
    if (this.readyState !== 1) throw new Error("send while not open");
    this.sent.push(decoder.decode(bytes));
  }

  close(code, reason) {
    this.closedWith = { code, reason };
    this.readyState = 3;
  }

  // --- what the test (the server) does ---
  open() {
    this.readyState = 1;
    this.onopen?.({});
  }

  /** The server sends one operation (a plain object, encoded as the server would). */
  receive(op) {
    const bytes = encoder.encode(op);
    this.onmessage?.({ data: bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length) });
  }

  /** The connection ends (1006: lost without a close frame). */
  drop(code = 1006, reason = "") {
    this.readyState = 3;
    this.onclose?.({ code, reason });
  }

  /** The client's operations named `op`, and clears them. */
  take(op) {
    const taken = this.sent.filter((o) => o.op === op);
    this.sent = this.sent.filter((o) => o.op !== op);
    return taken;
  }

  /** Open and answer `connect` with `connected`. */
  accept(server = "member") {
    this.open();
    this.receive({ op: "connected", server, version: 1 });
  }
}

const bytes = (text) => new TextEncoder().encode(text);

export function update(subject, seq, { epoch = 7, type = "update", content = `m${seq}` } = {}) {
  return { subject, content: bytes(content), epoch, seq, type };
}

export const message = (subject, seq, options) => ({ op: "message", ...update(subject, seq, options) });
export const batch = (messages) => ({ op: "batch", messages });
export const status = (name, subject, epoch = null, seq = null) => ({
  op: "status", status: name, subject, ...(epoch === null ? {} : { epoch, seq }),
});
