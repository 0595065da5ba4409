// One session: a WebSocket connection to one server, from `connect` to its loss.
//
// The session reads server operations and hands them to the Router, answers gaps with
// resubscriptions, and keeps the connection alive with protocol pings. Every way the
// session can end becomes one SessionEnd handed to `onEnd`, never an exception. The
// reader never waits for the application, so a pong or a close always gets read. When
// the server granted the heartbeat asked for in `connect`, nothing from it for twice the
// interval granted ends the session too, with no round trip (watchSilence).

import { monotonicMs, timerMs } from "./clock.js";
import { CloseCode, describeCloseCode, shouldReconnect } from "./close_codes.js";
import { SUBPROTOCOL, decodeServerOp, encodeClientOp } from "./codec.js";
import { ProtocolError } from "./errors.js";

const OPEN = 1;
/** Most entries in one subscribe when the server does not say its MaxSubjectsPerSubscribe
 * in `connected` (more close the session with 4000). */
export const SUBSCRIBE_CHUNK = 100;
/** Bytes a session's WebSocket may hold unsent before a publish waits for room: a server
 * that stops reading must not make the client buffer every publish the application
 * makes (a browser WebSocket takes them all; nothing else bounds it). */
export const MAX_BUFFERED_BYTES = 8 * 2 ** 20;
/** Largest server frame accepted (the Python SDK's MAX_FRAME_BYTES): a larger one loses
 * the session before it is decoded (a browser has received it whole by then). */
export const MAX_FRAME_BYTES = 64 * 2 ** 20;

/** Why a session ended: a close by the server (`code`, its `reason`), or a loss the
 * client saw or decided (code 1006). `terminal`: the code forbids retrying. `readAll`:
 * every frame the server sent before its close frame was handed over (a browser
 * WebSocket dispatches every message before its close event, so a close by the server
 * always has it). */
export class SessionEnd {
  constructor(code, reason, { terminal = false, byServer = false, readAll = false } = {}) {
    this.code = code;
    this.reason = reason;
    this.terminal = terminal;
    this.byServer = byServer;
    this.readAll = readAll;
    Object.freeze(this);
  }

  static closed(code, reason) {
    const byServer = code !== CloseCode.ABNORMAL;
    return new SessionEnd(code, reason || null, {
      terminal: !shouldReconnect(code), byServer, readAll: byServer,
    });
  }

  static byClient(reason) {
    return new SessionEnd(CloseCode.ABNORMAL, reason);
  }

  /** The server closed with 4502 DRAINED -- it answered every publish it took before
   * its close frame -- and every frame up to that close was read: a publish still
   * waiting was never taken (not published). Otherwise its outcome is unknown. */
  get untakenNotPublished() {
    return this.byServer && this.readAll && this.code === CloseCode.DRAINED;
  }

  describe() {
    if (!this.byServer) return this.reason || "connection lost without a close frame";
    return `closed with ${describeCloseCode(this.code)}${this.reason ? `: ${this.reason}` : ""}`;
  }
}

export class Session {
  /**
   * @param {object} o
   * @param {typeof WebSocket} o.WebSocket the WebSocket constructor (browser's, or `ws`)
   * @param {string} o.server the URL
   * @param {number} o.id
   * @param {import("./router.js").Router} o.router
   * @param {{interval: number, timeout: number, heartbeat: number|null}} o.keepalive seconds
   * @param {number} o.connectTimeout seconds
   * @param {number} o.healthyAfter seconds up after `connected` that make it `healthy`
   * @param {object} o.connectOp {op: "connect", client, token}
   * @param {(session: Session) => void} o.onLive the server answered `connected`
   * @param {(session: Session, end: SessionEnd) => void} o.onEnd called once
   */
  constructor(o) {
    Object.assign(this, {
      server: o.server, id: o.id, router: o.router, keepalive: o.keepalive,
      onLive: o.onLive, onEnd: o.onEnd,
    });
    this.live = false;
    /** The WebSocket opened (the upgrade was answered). */
    this.upgraded = false;
    this.ended = false;
    this.serverName = "";
    this.subscribeChunk = SUBSCRIBE_CHUNK;
    this.framesRead = 0;
    /** Heartbeats among them: a server that is idle, not one answering a ping. */
    this.heartbeatsRead = 0;
    /** Seconds: the server writes at least this often (granted in `connected`), or null. */
    this.heartbeat = null;
    this.pingId = 0;
    this.pongId = 0;
    this.healthyAfter = o.healthyAfter;
    /** It stayed up healthyAfter seconds after `connected`: its end resets the back-off. */
    this.healthy = false;
    /** Payload bytes handed to the WebSocket: with its bufferedAmount, whether it moved. */
    this.bytesQueued = 0;
    this.timers = new Set();
    this.connectOp = o.connectOp;
    try {
      this.ws = new o.WebSocket(o.server, [SUBPROTOCOL]);
    } catch (error) {
      this.ws = null;
      this.later(0, () => this.finish(SessionEnd.byClient(`cannot connect: ${error.message}`)));
      return;
    }
    this.ws.binaryType = "arraybuffer";
    this.ws.onopen = () => {
      this.upgraded = true;
      this.send(this.connectOp);
    };
    this.ws.onmessage = (event) => this.onFrame(event.data);
    this.ws.onclose = (event) => this.onClose(event);
    this.ws.onerror = (event) => this.onError(event);
    this.later(o.connectTimeout, () => {
      const what = this.ws.readyState === OPEN ? "no 'connected'" : "no WebSocket connection";
      this.finish(SessionEnd.byClient(`cannot connect: ${what} within ${o.connectTimeout} s`));
    }, "connect");
  }

  get isOpen() {
    return this.live && !this.ended;
  }

  /** Whether the WebSocket holds MAX_BUFFERED_BYTES not yet written: a publish waits. */
  get congested() {
    return this.ws !== null && this.ws.bufferedAmount >= MAX_BUFFERED_BYTES;
  }

  /** Send one client operation; false when the connection is not open (not sent). */
  send(op) {
    if (this.ended || this.ws === null || this.ws.readyState !== OPEN) return false;
    const bytes = encodeClientOp(op);
    this.ws.send(bytes);
    this.bytesQueued += bytes.length;
    return true;
  }

  /** Send subscription requests, in as many subscribe operations as the server's limit
   * asks (a reconnect resubscribes every subject at once); false when not sent (the
   * next session does it). */
  subscribe(requests) {
    for (let start = 0; start < requests.length; start += this.subscribeChunk) {
      const part = requests.slice(start, start + this.subscribeChunk);
      if (!this.send({ op: "subscribe", subscriptions: part })) return false;
      this.router.sent(this.id, part);
    }
    return true;
  }

  /** End the session from the client's side (code 1000, or an application code). */
  close(reason, code = CloseCode.NORMAL) {
    this.finish(SessionEnd.byClient(reason), code);
  }

  // --- reading ------------------------------------------------------------------

  onFrame(data) {
    if (this.ended) return;
    this.framesRead += 1;
    const size = typeof data === "string" ? data.length : data.byteLength;
    if (size > MAX_FRAME_BYTES) {
      this.finish(SessionEnd.byClient(`bad frame from the server (${CloseCode.MESSAGE_TOO_BIG} `
        + `MESSAGE_TOO_BIG: ${size} bytes, more than ${MAX_FRAME_BYTES})`));
      return;
    }
    try {
      if (typeof data === "string") {
        throw new ProtocolError(CloseCode.UNSUPPORTED_DATA, "text frame from the server");
      }
      this.dispatch(decodeServerOp(data));
    } catch (error) {
      if (!(error instanceof ProtocolError)) throw error;
      this.finish(SessionEnd.byClient(`server broke the protocol: ${error.reason}`),
        error.closeCode);
    }
  }

  dispatch(op) {
    if (op.op === "unknown") {
      this.router.onUnknownOp(op.name, this.server);
      return;
    }
    if (!this.live) {
      if (op.op !== "connected") {
        this.finish(SessionEnd.byClient(`handshake failed: expected 'connected', got '${op.op}'`),
          CloseCode.PROTOCOL_ERROR);
        return;
      }
      this.live = true;
      this.serverName = op.server;
      this.subscribeChunk = op.maxSubjectsPerSubscribe || SUBSCRIBE_CHUNK;
      const asked = this.connectOp.heartbeatMs;
      if (asked !== undefined && asked !== null && op.heartbeatMs !== null) {
        this.heartbeat = Math.max(asked, op.heartbeatMs) / 1000; // never less than asked
        this.watchSilence(this.framesRead, monotonicMs());
      }
      this.cancel("connect");
      this.later(this.healthyAfter, () => { this.healthy = true; }, "healthy");
      // the subscribes first: onLive sends the publishes held for a session, made after
      // them (a subscribe then a publish of its subject gets the message)
      this.subscribe(this.router.requestsFor(this.id));
      this.onLive(this);
      this.scheduleKeepalive();
      return;
    }
    switch (op.op) {
      case "deliver": {
        const reaction = this.router.onMessages(op.messages);
        if (reaction.pause.length) this.send({ op: "unsubscribe", subjects: reaction.pause });
        this.subscribe(reaction.resubscribe);
        break;
      }
      case "status":
        this.subscribe(this.router.onSubjectStatus(op, this.server, this.id));
        break;
      case "publish_status":
        this.router.onPublishStatus(op, this.server);
        break;
      case "pong":
        if (op.id === null && this.heartbeat !== null) this.heartbeatsRead += 1; // no answer
        else this.onPong(op.id);
        break;
      default: // a second "connected": ignored, as the Python SDK does
    }
  }

  /** A browser fires `close` right after `error`; node 20's WebSocket (undici) fires no
   * `close` for a connection that failed before the upgrade (refused, reset, a non-101
   * answer), and the attempt waited its whole connectTimeout, saying "no WebSocket
   * connection within 10 s" of a member that refused it at once. */
  onError(event) {
    if (this.upgraded) return; // its close event says how it ended
    const why = event?.message ? `: ${event.message}` : "";
    this.later(0, () => this.finish(SessionEnd.byClient(`cannot connect: the WebSocket `
      + `connection failed${why}`)), "connect");
  }

  onClose(event) {
    const code = typeof event.code === "number" && event.code > 0 ? event.code : 1005;
    this.finish(SessionEnd.closed(code, event.reason));
  }

  // --- keepalive ----------------------------------------------------------------

  scheduleKeepalive() {
    this.later(this.keepalive.interval, () => this.ping(), "keepalive");
  }

  ping() {
    this.pingId += 1;
    this.send({ op: "ping", id: this.pingId });
    this.waitPong(this.answersRead());
  }

  /** Frames read but heartbeats: a heartbeat, sent idle, is no answer ahead of a pong. */
  answersRead() {
    return this.framesRead - this.heartbeatsRead;
  }

  // The server writes at least every `heartbeat` s: no frame for twice that ends the
  // session (a member frozen or cut off without a close is left within 2-2.5 intervals,
  // while the cache still holds what the resume needs). Looked at 4 times per limit;
  // a silence is counted only while this side ran to see it.
  watchSilence(framesBefore, heardAt) {
    const limit = 2 * this.heartbeat;
    const due = monotonicMs() + (limit / 4) * 1000;
    this.later(limit / 4, () => {
      const now = monotonicMs();
      // woken late: this page stood still (a busy thread, a throttled tab), not the server
      if (this.framesRead !== framesBefore || now - due > (limit / 4) * 1000) {
        this.watchSilence(this.framesRead, now);
      } else if (now - heardAt >= limit * 1000) {
        const reason = `nothing from the server for ${limit} s (heartbeat ${this.heartbeat} s)`;
        this.finish(SessionEnd.byClient(reason));
      } else {
        this.watchSilence(framesBefore, heardAt);
      }
    }, "silence");
  }

  // No pong within `timeout`: lost, unless frames kept arriving meanwhile (a large
  // answer ahead of the pong), then wait once more -- but not while the WebSocket wrote
  // nothing of what it holds (a server that stopped reading, as the Python SDK's send
  // of which no byte goes out for the timeout).
  waitPong(framesBefore, queuedBefore = this.bytesQueued, bufferedBefore = this.buffered()) {
    this.later(this.keepalive.timeout, () => {
      if (this.pongId >= this.pingId) return;
      const buffered = this.buffered();
      const written = bufferedBefore + (this.bytesQueued - queuedBefore) - buffered;
      if (buffered > 0 && written <= 0) {
        this.finish(SessionEnd.byClient(`could not send for ${this.keepalive.timeout} s`));
        return;
      }
      if (this.answersRead() !== framesBefore) {
        this.waitPong(this.answersRead());
        return;
      }
      this.finish(SessionEnd.byClient(`no pong within ${this.keepalive.timeout} s`));
    }, "pong");
  }

  buffered() {
    return this.ws?.bufferedAmount ?? 0;
  }

  onPong(id) {
    // a pong answers at most the last ping sent: one with a later id (a server's bug)
    // must not stand for pings not sent yet, or a dead connection would go unnoticed
    this.pongId = Math.max(this.pongId, id === null ? this.pingId : Math.min(id, this.pingId));
    if (this.pongId >= this.pingId) {
      this.cancel("pong");
      this.scheduleKeepalive();
    }
  }

  // --- the end ------------------------------------------------------------------

  later(seconds, callback, name = null) {
    if (name !== null) this.cancel(name);
    const timer = { name, handle: null };
    timer.handle = setTimeout(() => {
      this.timers.delete(timer);
      callback();
    }, timerMs(seconds));
    this.timers.add(timer);
  }

  cancel(name) {
    for (const timer of this.timers) {
      if (timer.name === name) {
        clearTimeout(timer.handle);
        this.timers.delete(timer);
      }
    }
  }

  /** End once: stop the timers, let go of the socket (closing it if still open: a
   * browser sends only 1000 or 3000-4999), tell the client. */
  finish(end, closeCode = CloseCode.NORMAL) {
    if (this.ended) return;
    this.ended = true;
    for (const timer of this.timers) clearTimeout(timer.handle);
    this.timers.clear();
    const ws = this.ws;
    if (ws !== null) {
      ws.onopen = ws.onmessage = ws.onclose = null;
      ws.onerror = () => {}; // (the `ws` package throws an error nobody listens to)
      if (ws.readyState <= OPEN) {
        const code = closeCode === CloseCode.NORMAL || (closeCode >= 3000 && closeCode <= 4999)
          ? closeCode : CloseCode.NORMAL;
        try {
          ws.close(code, end.describe().slice(0, 120));
        } catch { /* already closing */ }
      }
    }
    this.onEnd(this, end);
  }
}
