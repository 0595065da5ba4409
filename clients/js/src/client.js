// The client: one object per application, sessions come and go underneath.
//
// `connect(servers, options)` keeps a session open to one of the servers (weighted
// random choice, back-off with jitter between attempts, another server preferred after
// a failure), resubscribes every subject from its last delivered position after each
// reconnect, and ends with an error when a server closes with a terminal code.

import { Backoff, reconnectPolicy } from "./backoff.js";
import { MAX_TIMER_MS, monotonicMs, timerMs } from "./clock.js";
import { Qos } from "./codec.js";
import {
  ClientClosedError, ConnectionClosedError, NotConnectedError, PublishOutcomeUnknown,
  ServerUnavailableError,
} from "./errors.js";
import { Notifications } from "./notifications.js";
import { SubjectTracker } from "./resume.js";
import { Router, notification } from "./router.js";
import { chooseServer, parseServers } from "./servers.js";
import { Session } from "./session.js";
import { Subscription } from "./subscription.js";

const DEFAULTS = Object.freeze({
  token: null,
  tokenProvider: null,
  name: "",
  reconnect: {},
  keepalive: { interval: 15, timeout: 10, heartbeat: 2 },
  messageBuffer: 10_000,
  notificationBuffer: 10_000,
  random: Math.random,
  WebSocket: undefined,
});
const textEncoder = new TextEncoder();
/** How often publishes waiting for room look again. */
const OUTGOING_POLL_MS = 10;

function checkOptions(options) {
  const unknown = Object.keys(options).filter((k) => !Object.hasOwn(DEFAULTS, k));
  if (unknown.length) throw new TypeError(`connect: unknown option(s) ${unknown.join(", ")}`);
  const o = { ...DEFAULTS, ...options };
  const ka = { ...DEFAULTS.keepalive, ...o.keepalive };
  if (!(ka.interval > 0 && ka.timeout > 0)) {
    throw new RangeError("connect: keepalive interval and timeout must be > 0");
  }
  if (ka.heartbeat !== null && !(ka.heartbeat >= 0.001 && ka.heartbeat <= 3600)) {
    throw new RangeError("connect: keepalive heartbeat must be null or from 0.001 to 3600 s");
  }
  if (!(Number.isInteger(o.messageBuffer) && o.messageBuffer >= 1)) {
    throw new RangeError("connect: messageBuffer must be an integer >= 1");
  }
  if (o.tokenProvider !== null && typeof o.tokenProvider !== "function") {
    throw new TypeError("connect: tokenProvider must be a function returning the token");
  }
  const WebSocketClass = o.WebSocket ?? globalThis.WebSocket;
  if (typeof WebSocketClass !== "function") {
    throw new TypeError("connect: no WebSocket here; pass options.WebSocket (e.g. from 'ws')");
  }
  return { ...o, keepalive: Object.freeze(ka), reconnect: reconnectPolicy(o.reconnect),
    WebSocket: WebSocketClass };
}

/** The heartbeat asked for in `connect`, in ms (null: none asked). */
function heartbeatMs(keepalive) {
  return keepalive.heartbeat === null ? null : Math.round(keepalive.heartbeat * 1000);
}

function randomHex(random, bytes) {
  return Array.from({ length: bytes }, () => Math.floor(random() * 256).toString(16).padStart(2, "0")).join("");
}

export class Client {
  constructor(servers, options = {}) {
    this.options = checkOptions(options);
    this.servers = parseServers(servers);
    this.backoff = new Backoff(this.options.reconnect, this.options.random);
    this.notificationQueue = new Notifications(this.options.notificationBuffer);
    this.router = new Router((n) => this.notificationQueue.put(n));
    this.sessionIds = 0;
    this.closurePrefix = randomHex(this.options.random, 6);
    this.closures = 0;
    this.live = null;
    /** The latest session, open or still opening. */
    this.session = null;
    this.liveWaiters = [];
    /** Publishes waiting for a session with room, in the order they were made. */
    this.outgoing = [];
    this.outgoingTimer = null;
    this.error = null;
    this.closed = false;
    this.retryTimer = null;
    /** The token provider's time limit while it is asked: {timer}. */
    this.tokenWait = null;
    this.attempt(null);
  }

  /** URL of the server of the open session, or null. */
  get server() {
    return this.live?.server ?? null;
  }

  /** Call `listener(notification)` for every notification; returns a function to stop.
   * Notification: {status, subject, position, reason, server}. */
  onNotification(listener) {
    return this.notificationQueue.listen(listener);
  }

  /** Async iterator of notifications; bounded: when nobody reads, the oldest are dropped. */
  notifications() {
    return this.notificationQueue;
  }

  /** Resolves with the server URL once a session is open. */
  waitConnected() {
    return this.waitLive().then((session) => session.server);
  }

  /** The open session; with `seconds`, rejects with `makeError()` after that long and
   * lets go of its waiter (publishes while every server is down must not pile up). */
  waitLive(seconds = null, makeError = null) {
    try {
      this.raiseIfEnded();
    } catch (error) {
      return Promise.reject(error);
    }
    if (this.live !== null && this.live.isOpen) return Promise.resolve(this.live);
    return new Promise((resolve, reject) => {
      const waiter = { resolve, reject, timer: null };
      this.liveWaiters.push(waiter);
      if (seconds === null) return;
      waiter.timer = setTimeout(() => {
        const at = this.liveWaiters.indexOf(waiter);
        if (at >= 0) this.liveWaiters.splice(at, 1);
        reject(makeError());
      }, timerMs(seconds));
    });
  }

  raiseIfEnded() {
    if (this.error !== null) throw this.error;
    if (this.closed) throw new ClientClosedError();
  }

  setLive(session) {
    this.live = session;
    if (session === null) return;
    for (const waiter of this.liveWaiters.splice(0)) {
      clearTimeout(waiter.timer);
      waiter.resolve(session);
    }
    this.sendOutgoing();
  }

  // --- subscribe ----------------------------------------------------------------

  /** Subscribe to `subjects` (a string or an array); sent now or on the next session.
   * `history`: the last N cached messages first (type historical) instead of the
   * snapshot; `conflationMs` >= 100: one merged message per period; `onMessage`: a
   * callback instead of async iteration. A subject belongs to one subscription at a time. */
  subscribe(subjects, { history = 0, conflationMs = 0, onMessage = undefined } = {}) {
    this.raiseIfEnded();
    const list = [...new Set(typeof subjects === "string" ? [subjects] : subjects)];
    if (!list.length) throw new TypeError("subscribe needs at least one subject");
    if (!list.every((s) => typeof s === "string")) throw new TypeError("subjects must be strings");
    if (!(Number.isInteger(history) && history >= 0 && Number.isInteger(conflationMs)
      && conflationMs >= 0)) {
      throw new RangeError("history and conflationMs must be integers >= 0");
    }
    const subscription = new Subscription({
      subjects: list,
      capacity: this.options.messageBuffer,
      onMessage,
      unsubscribe: (s) => this.unsubscribe(s),
      resume: (s) => this.resume(s),
    });
    this.router.add(list.map((s) => new SubjectTracker(s, { history, conflationMs })), subscription);
    if (this.live !== null && this.live.isOpen) {
      this.live.subscribe(this.router.requestsFor(this.live.id, list));
    }
    return subscription;
  }

  resume(subscription) {
    if (this.closed || this.error !== null) return;
    const subjects = this.router.resume(subscription);
    if (subjects.length && this.live !== null && this.live.isOpen) {
      this.live.subscribe(this.router.requestsFor(this.live.id, subjects));
    }
  }

  async unsubscribe(subscription) {
    this.router.remove(subscription.subjects);
    if (this.live !== null && this.live.isOpen) {
      this.live.send({ op: "unsubscribe", subjects: subscription.subjects });
    }
  }

  // --- publish ------------------------------------------------------------------

  /** Publish and wait for the server's status. Resolves {status: "PUBLISH_OK", subject,
   * position} or rejects: PublishError (PublishFailedError, PublishDeniedError,
   * MessageSizeLimitExceededError: definitely not published), NotConnectedError (no
   * session within `timeout` s: not sent), PublishOutcomeUnknown (sent, no status: the
   * connection dropped or `timeout` passed), ClientClosedError. `content`: string or bytes. */
  async publish(subject, content, { fields = {}, retained = false, qos = Qos.STANDARD,
    timeout = 10 } = {}) {
    this.closures += 1;
    const closure = `${this.closurePrefix}-${this.closures}`;
    const op = publishOp(subject, content, fields, retained, qos, closure);
    const deadline = monotonicMs() + timeout * 1000;
    let pending;
    const answer = new Promise((resolve, reject) => {
      pending = { subject, closure, resolve, reject };
    });
    await this.sendPublish(op, subject, timeout, deadline);
    this.router.pending.set(closure, pending); // no frame is read before this: same turn
    let timedOut = false;
    try {
      return await withTimeout(answer, Math.max(0, deadline - monotonicMs()), () => {
        timedOut = true;
        return new PublishOutcomeUnknown(subject, closure, `no status in ${timeout} s`);
      });
    } finally {
      this.router.pending.delete(closure);
      if (timedOut) this.router.givenUp(closure); // its status may still come: told once
    }
  }

  /** Send a publish on the open session once its WebSocket has room (MAX_BUFFERED_BYTES),
   * in the order publishes were made: one that finds others waiting waits behind them.
   * A session that ends first did not take it: the next one does. Rejects with
   * NotConnectedError (not sent) at `deadline`, or the client's end. */
  sendPublish(op, subject, timeout, deadline) {
    try {
      this.raiseIfEnded();
    } catch (error) {
      return Promise.reject(error);
    }
    if (this.outgoing.length === 0 && this.trySend(op)) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const entry = { op, resolve, reject, timer: null };
      entry.timer = setTimeout(() => {
        this.outgoing.splice(this.outgoing.indexOf(entry), 1);
        const session = this.live;
        reject(new NotConnectedError(subject, timeout, session?.isOpen
          ? `the connection to ${session.server} took nothing more within ${timeout} s`
          : undefined));
      }, timerMs((deadline - monotonicMs()) / 1000));
      this.outgoing.push(entry);
      this.sendOutgoing();
    });
  }

  trySend(op) {
    const session = this.live;
    return session !== null && session.isOpen && !session.congested && session.send(op);
  }

  /** Send the publishes waiting, first first, while there is room; look again soon while
   * some wait on an open session (a browser has no event for "the WebSocket wrote what it
   * held"); without one, the next session's start sends them. */
  sendOutgoing() {
    while (this.outgoing.length && this.trySend(this.outgoing[0].op)) {
      const entry = this.outgoing.shift();
      clearTimeout(entry.timer);
      entry.resolve();
    }
    if (this.outgoing.length && this.outgoingTimer === null && this.live?.isOpen) {
      this.outgoingTimer = setTimeout(() => {
        this.outgoingTimer = null;
        this.sendOutgoing();
      }, OUTGOING_POLL_MS);
    }
  }

  /** Publish without a closure: no PUBLISH_OK; failures arrive as notifications. Waits
   * up to `timeout` s for a session whose WebSocket has room (MAX_BUFFERED_BYTES), then
   * rejects with NotConnectedError: not sent (nothing piles up while every server is
   * down or one stopped reading). */
  async publishNoWait(subject, content, { fields = {}, retained = false, qos = Qos.STANDARD,
    timeout = 10 } = {}) {
    const op = publishOp(subject, content, fields, retained, qos, null);
    await this.sendPublish(op, subject, timeout, monotonicMs() + timeout * 1000);
  }

  // --- sessions -----------------------------------------------------------------

  attempt(failed) {
    this.retryTimer = null;
    if (this.closed || this.error !== null) return;
    const server = chooseServer(this.servers, this.options.random, failed);
    const provider = this.options.tokenProvider;
    if (provider === null) {
      this.openSession(server, this.options.token);
      return;
    }
    // a fresh token for every session: one whose token expired (4503) reconnects with it;
    // a provider that fails or does not answer within connectTimeout is a failed attempt
    const seconds = this.options.reconnect.connectTimeout;
    const late = new Error(`gave no token within ${seconds} s`);
    this.tokenWait = { timer: null }; // close() stops its timer: the page or process may end
    withTimeout(Promise.resolve().then(() => provider()), seconds * 1000, () => late,
      this.tokenWait).then(
      (token) => {
        if (!this.closed && this.error === null) this.openSession(server, token ?? null);
      },
      (error) => {
        if (this.closed || this.error !== null) return;
        const reason = error === late ? `token provider ${late.message}`
          : `token provider failed: ${error?.message ?? error}`;
        this.retry(server, reason);
      },
    );
  }

  openSession(server, token) {
    this.sessionIds += 1;
    this.session = new Session({
      WebSocket: this.options.WebSocket,
      server: server.url,
      id: this.sessionIds,
      router: this.router,
      keepalive: this.options.keepalive,
      connectTimeout: this.options.reconnect.connectTimeout,
      healthyAfter: this.options.reconnect.healthyAfter,
      connectOp: { op: "connect", client: this.options.name, token, heartbeatMs: heartbeatMs(
        this.options.keepalive) },
      onLive: (session) => this.onLive(session),
      onEnd: (session, end) => this.onSessionEnd(server, session, end),
    });
  }

  onLive(session) {
    if (this.closed) {
      session.close("client closed");
      return;
    }
    this.setLive(session);
    this.notificationQueue.put(notification("SERVER_UP", { server: session.server }));
  }

  onSessionEnd(server, session, end) {
    if (this.live === session) this.setLive(null);
    this.router.sessionLost(`connection to ${server.url} lost: ${end.describe()}`,
      { untakenFailed: end.untakenNotPublished });
    if (this.closed) return;
    if (session.healthy) this.backoff.reset(); // else it ended soon: a failed attempt
    if (end.terminal) {
      this.notificationQueue.put(notification("SERVER_DOWN", { reason: end.describe(), server: server.url }));
      this.end(new ConnectionClosedError(end.code, end.reason, server.url));
      return;
    }
    this.retry(server, end.describe());
  }

  /** An attempt on `server` failed (or its session ended) for `reason`: SERVER_DOWN,
   * then the next attempt after the back-off, unless maxAttempts are spent. */
  retry(server, reason) {
    this.notificationQueue.put(notification("SERVER_DOWN", { reason, server: server.url }));
    const delay = this.backoff.nextDelay();
    if (this.backoff.exhausted()) {
      this.end(new ServerUnavailableError(this.backoff.failures, reason));
      return;
    }
    this.retryTimer = setTimeout(() => this.attempt(server), timerMs(delay));
  }

  end(error) {
    if (this.error === null && !this.closed) this.error = error;
    const reason = this.error ?? new ClientClosedError();
    for (const waiter of [...this.liveWaiters.splice(0), ...this.outgoing.splice(0)]) {
      clearTimeout(waiter.timer);
      waiter.reject(reason);
    }
    clearTimeout(this.outgoingTimer);
    this.outgoingTimer = null;
    this.router.close(this.error);
    this.notificationQueue.close(this.error);
  }

  /** Close the session (code 1000) and end every subscription and waiter. */
  async close() {
    if (this.closed) return;
    this.closed = true;
    if (this.retryTimer !== null) clearTimeout(this.retryTimer);
    clearTimeout(this.tokenWait?.timer); // a token provider still thinking: not waited for
    this.setLive(null);
    this.session?.close("client closed");
    this.end(null);
  }
}

function publishOp(subject, content, fields, retained, qos, closure) {
  if (typeof subject !== "string") throw new TypeError("subject must be a string");
  const bytes = typeof content === "string" ? textEncoder.encode(content)
    : content instanceof Uint8Array ? content
      : content instanceof ArrayBuffer ? new Uint8Array(content) : null;
  if (bytes === null) throw new TypeError("content must be a string, Uint8Array or ArrayBuffer");
  if (!Object.entries(fields).every(([k, v]) => typeof k === "string" && typeof v === "string")) {
    throw new TypeError("fields must map strings to strings");
  }
  if (qos !== Qos.STANDARD && qos !== Qos.GUARANTEED) {
    throw new TypeError("qos must be 'standard' or 'guaranteed'");
  }
  return { op: "publish", subject, content: bytes, fields, retained, qos, closure };
}

/** `promise`, or `makeError()` after `ms`; `holder.timer` (if given): the timer, for
 * whoever must stop it sooner. */
function withTimeout(promise, ms, makeError, holder = {}) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(makeError()), Math.min(ms, MAX_TIMER_MS));
  });
  holder.timer = timer;
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** Open a client; sessions are opened in the background (watch SERVER_UP).
 * `servers`: "WEIGHT URL" or "URL" (weight 100) entries. */
export function connect(servers, options = {}) {
  return new Client(servers, options);
}
