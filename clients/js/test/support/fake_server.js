// A scripted server on a real socket (127.0.0.1) for the client tests that need one: it
// answers the WebSocket upgrade (or not), reads the client's masked frames, and writes
// whatever the test says -- operations, raw bytes, half a frame, a close, a reset -- or
// stops reading. The client runs on node's own WebSocket (undici), as in a browser.

import crypto from "node:crypto";
import net from "node:net";

import { Decoder, Encoder } from "cbor-x";

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
const encoder = new Encoder({ useRecords: false, variableMapSize: true, tagUint8Array: false });
const decoder = new Decoder({ useRecords: false, mapsAsObjects: true, int64AsNumber: true });

/** One unmasked server frame. */
export function frame(payload, opcode = 0x2) {
  const n = payload.length;
  const head = n < 126 ? Buffer.from([0x80 | opcode, n])
    : n < 0x10000 ? Buffer.from([0x80 | opcode, 126, n >> 8, n & 255])
      : Buffer.concat([Buffer.from([0x80 | opcode, 127]), bigEndian64(n)]);
  return Buffer.concat([head, Buffer.from(payload)]);
}

export function bigEndian64(n) {
  const bytes = Buffer.alloc(8);
  bytes.writeBigUInt64BE(BigInt(n));
  return bytes;
}

/** The frame of one server operation (a plain object, encoded as the server would). */
export const opFrame = (op) => frame(encoder.encode(op));

export function closeFrame(code, reason = "") {
  const body = Buffer.concat([Buffer.from([code >> 8, code & 255]), Buffer.from(reason)]);
  return frame(body, 0x8);
}

export class FakeServer {
  /** `upgrade: false`: accept TCP connections and never answer them. */
  static async start({ upgrade = true } = {}) {
    const server = new FakeServer(upgrade);
    await new Promise((resolve) => { server.listener.listen(0, "127.0.0.1", resolve); });
    server.url = `ws://127.0.0.1:${server.listener.address().port}`;
    return server;
  }

  constructor(upgrade) {
    this.upgrade = upgrade;
    this.connections = [];
    this.waiting = [];
    this.sockets = new Set();
    this.listener = net.createServer((socket) => this.accept(socket));
  }

  accept(socket) {
    this.sockets.add(socket);
    socket.on("error", () => {});
    socket.on("close", () => this.sockets.delete(socket));
    if (!this.upgrade) return;
    let head = Buffer.alloc(0);
    const onData = (data) => {
      head = Buffer.concat([head, data]);
      const end = head.indexOf("\r\n\r\n");
      if (end < 0) return;
      socket.off("data", onData);
      const request = head.subarray(0, end).toString("latin1");
      const key = /sec-websocket-key:\s*(\S+)/i.exec(request)[1];
      const accept = crypto.createHash("sha1").update(key + GUID).digest("base64");
      const protocol = /sec-websocket-protocol:/i.test(request)
        ? "Sec-WebSocket-Protocol: migratory.cbor\r\n" : "";
      socket.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
        + `Connection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n${protocol}\r\n`);
      const connection = new FakeConnection(socket, head.subarray(end + 4));
      this.connections.push(connection);
      const waiter = this.waiting.shift();
      if (waiter) waiter(connection);
      else this.ready = [...(this.ready ?? []), connection];
    };
    socket.on("data", onData);
  }

  /** The next upgraded connection. */
  nextConnection() {
    if (this.ready?.length) return Promise.resolve(this.ready.shift());
    return new Promise((resolve) => { this.waiting.push(resolve); });
  }

  close() {
    for (const socket of this.sockets) socket.destroy();
    this.listener.close();
  }
}

export class FakeConnection {
  constructor(socket, rest) {
    this.socket = socket;
    this.buffer = Buffer.alloc(0);
    this.chunks = [];
    this.received = 0;
    this.needed = 2;
    this.ops = [];
    this.waiters = [];
    this.autoPong = true;
    this.closeCode = null;
    this.ended = false;
    socket.on("data", (data) => this.onData(data));
    socket.on("close", () => { this.ended = true; this.wake(); });
    if (rest.length) this.onData(rest);
  }

  onData(data) {
    this.chunks.push(data);
    this.received += data.length;
    if (this.received < this.needed) return; // a large frame: join its chunks once
    this.buffer = Buffer.concat([this.buffer, ...this.chunks.splice(0)]);
    this.received = this.buffer.length;
    for (;;) {
      const parsed = parseClientFrame(this.buffer);
      if (typeof parsed === "number") {
        this.needed = parsed;
        break;
      }
      this.received -= parsed.size;
      this.buffer = this.buffer.subarray(parsed.size);
      if (parsed.opcode === 0x8) {
        this.closeCode = parsed.payload.length >= 2 ? parsed.payload.readUInt16BE(0) : 1005;
        if (!this.socket.destroyed) this.socket.end(closeFrame(this.closeCode));
      } else if (parsed.opcode === 0x2) {
        const op = decoder.decode(parsed.payload);
        if (op.op === "ping" && this.autoPong) this.send({ op: "pong", id: op.id });
        else if (op.op !== "ping") this.ops.push(op);
      }
    }
    this.wake();
  }

  wake() {
    for (const waiter of this.waiters.splice(0)) waiter();
  }

  /** The next client operation (pings answered on the way); null once the connection ended. */
  async receive() {
    while (!this.ops.length) {
      if (this.ended || this.closeCode !== null) return null;
      await new Promise((resolve) => { this.waiters.push(resolve); });
    }
    return this.ops.shift();
  }

  async expect(name) {
    const op = await this.receive();
    if (op?.op !== name) throw new Error(`expected ${name}, got ${JSON.stringify(op)}`);
    return op;
  }

  /** Wait for the client's close frame (answered); its code. */
  async closedByClient() {
    while (this.closeCode === null && !this.ended) {
      await new Promise((resolve) => { this.waiters.push(resolve); });
    }
    return this.closeCode ?? 1006;
  }

  send(...ops) {
    this.write(Buffer.concat(ops.map(opFrame)));
  }

  write(bytes) {
    if (!this.socket.destroyed) this.socket.write(bytes);
  }

  async acceptSession(server = "fake") {
    const connect = await this.expect("connect");
    this.send({ op: "connected", server, version: 1 });
    return connect;
  }

  /** Lose the connection with a TCP reset, after `bytes` if given. */
  reset(bytes = null) {
    if (bytes !== null) this.socket.write(bytes, () => this.socket.resetAndDestroy());
    else this.socket.resetAndDestroy();
  }

  /** Read nothing more: what the client writes piles up in the kernel's buffers. */
  stopReading() {
    this.socket.pause();
  }

  resumeReading() {
    this.socket.resume();
  }
}

/** The first frame of `buffer`, or the number of bytes it needs to be whole. */
function parseClientFrame(buffer) {
  if (buffer.length < 2) return 2;
  const opcode = buffer[0] & 0x0f;
  let length = buffer[1] & 0x7f;
  let offset = 2;
  if (length === 126) {
    if (buffer.length < 4) return 4;
    length = buffer.readUInt16BE(2);
    offset = 4;
  } else if (length === 127) {
    if (buffer.length < 10) return 10;
    length = Number(buffer.readBigUInt64BE(2));
    offset = 10;
  }
  if (buffer.length < offset + 4 + length) return offset + 4 + length;
  const mask = buffer.subarray(offset, offset + 4);
  const payload = Buffer.from(buffer.subarray(offset + 4, offset + 4 + length));
  for (let i = 0; i < payload.length; i += 1) payload[i] ^= mask[i % 4];
  return { opcode, payload, size: offset + 4 + length };
}
