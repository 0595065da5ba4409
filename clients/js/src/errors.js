// Errors of the client, each with the structured fields an application acts on.

import { describeCloseCode } from "./close_codes.js";

/** Base class of every error the client raises on purpose. */
export class MigratoryError extends Error {
  constructor(message) {
    super(message);
    this.name = new.target.name;
  }
}

/** A server closed the session with a terminal close code; the client gave up. */
export class ConnectionClosedError extends MigratoryError {
  constructor(code, reason, server) {
    super(`${server} closed the session with ${describeCloseCode(code)}: ${reason || "-"}`);
    this.code = code;
    this.reason = reason;
    this.server = server;
  }
}

/** No server accepted a session within `attempts` consecutive attempts. */
export class ServerUnavailableError extends MigratoryError {
  constructor(attempts, lastReason) {
    super(`no server reachable after ${attempts} attempts; last: ${lastReason}`);
    this.attempts = attempts;
    this.lastReason = lastReason;
  }
}

/** The client was closed by the application; it cannot be used any more. */
export class ClientClosedError extends MigratoryError {
  constructor() {
    super("the client is closed");
  }
}

/** No session came up within `timeout` seconds, or none whose WebSocket had room
 * (a server that stopped reading): the message was **not** sent. */
export class NotConnectedError extends MigratoryError {
  constructor(subject, timeout, reason = `no server session within ${timeout} s`) {
    super(`not published to ${subject}: ${reason}`);
    this.subject = subject;
    this.timeout = timeout;
    this.reason = reason;
  }
}

/** A publish was sent but its status never came back: it may or may not be published.
 * The client never re-sends on its own (that could publish it twice). */
export class PublishOutcomeUnknown extends MigratoryError {
  constructor(subject, closure, reason) {
    super(`outcome of publish ${closure} to ${subject} unknown: ${reason}`);
    this.subject = subject;
    this.closure = closure;
    this.reason = reason;
  }
}

/** The server answered a publish with a status other than PUBLISH_OK (definite: not
 * published). `status` is PUBLISH_FAILED, PUBLISH_DENIED or MESSAGE_SIZE_LIMIT_EXCEEDED. */
export class PublishError extends MigratoryError {
  constructor(status, subject, reason) {
    super(`${status} for ${subject}: ${reason || "-"}`);
    this.status = status;
    this.subject = subject;
    this.reason = reason;
  }
}

export class PublishFailedError extends PublishError {}
export class PublishDeniedError extends PublishError {}
export class MessageSizeLimitExceededError extends PublishError {}

/** The typed error for a publish status other than PUBLISH_OK. */
export function publishError(status, subject, reason) {
  const kind = {
    PUBLISH_DENIED: PublishDeniedError,
    MESSAGE_SIZE_LIMIT_EXCEEDED: MessageSizeLimitExceededError,
  }[status] ?? PublishFailedError;
  return new kind(status, subject, reason);
}

/** The server sent a frame that is not a valid operation; `closeCode` is the code
 * to answer with (from the shared table), `reason` names the offending key. */
export class ProtocolError extends MigratoryError {
  constructor(closeCode, reason) {
    super(reason);
    this.closeCode = closeCode;
    this.reason = reason;
  }
}
