// Where server operations go: subject trackers and subscriptions, publish waiters,
// notifications. Shared by every session of one client; survives reconnects.
//
// The router never waits for the application: a message for a subscription whose
// buffer is full is not handed over; the subscription is paused instead (its subjects
// are left at the server, their positions stay where the application's messages end)
// and resumed from those positions once the application has taken half of the buffer:
// the messages come again as recovered (as the Python SDK's routing.py).
//
// A subscribe the server refuses whole because its answer would not fit in the client's
// outbox (SUBSCRIBE_DENY "subscribe answer too large" for every entry: a reconnect that
// resumes many subjects with much to recover) does not deny those subjects: they are
// asked for again one at a time, each once the answer before it is complete. A resume
// refused so when alone could never be answered: the subject starts again from its
// snapshot, announced as DATA_RESYNC. Only a first subscribe refused so alone is denied.

import { PROTOCOL_VERSION, SUBSCRIBE_TOO_LARGE } from "./codec.js";
import { PublishOutcomeUnknown, publishError } from "./errors.js";
import { Verdict } from "./resume.js";

/** One client notification; `subject` and `position` are null for server events. */
export function notification(status, { subject = null, position = null, reason = null,
  server = null, closure = null } = {}) {
  return Object.freeze({ status, subject, position, reason, server, closure });
}

/** Closures of publishes given up (timed out) whose late status is still told. */
export const GIVEN_UP_REMEMBERED = 10_000;
/** Distinct unknown operations counted by name; any further are counted together. */
export const UNKNOWN_OPS_NAMED = 50;
export const OTHER_UNKNOWN_OPS = "(others)";

export class Router {
  /** `notify(notification)` receives every notification. */
  constructor(notify) {
    this.notify = notify;
    /** @type {Map<string, import("./resume.js").SubjectTracker>} */
    this.trackers = new Map();
    /** closure -> {subject, closure, resolve, reject} */
    this.pending = new Map();
    /** Closures of publishes whose publish() gave up waiting, oldest first. */
    this.givenUpClosures = new Set();
    this.strayPublishStatuses = 0;
    /** Server operations of no protocol version this client knows, by op: ignored. */
    this.unknownOps = new Map();
    /** subject -> subscription (its outlet: paused, full(), push(), end()) */
    this.outlets = new Map();
    /** Subjects of a subscribe refused whole as too large, to ask for one at a time. */
    this.alone = [];
    /** The subject asked for alone whose answer is not complete yet. */
    this.aloneDue = null;
  }

  // --- subscriptions ----------------------------------------------------------

  add(trackers, outlet) {
    const taken = trackers.filter((t) => this.trackers.has(t.subject)).map((t) => t.subject);
    if (taken.length) throw new Error(`already subscribed: ${taken.join(", ")}`);
    for (const tracker of trackers) {
      this.trackers.set(tracker.subject, tracker);
      this.outlets.set(tracker.subject, outlet);
    }
  }

  remove(subjects) {
    for (const subject of subjects) {
      this.trackers.delete(subject);
      this.outlets.delete(subject);
    }
  }

  /** Subscriptions not yet sent on session `sessionId` (all, or of `subjects`); marks
   * them as requested there. */
  requestsFor(sessionId, subjects = null) {
    const chosen = subjects === null
      ? [...this.trackers.values()]
      : subjects.filter((s) => this.trackers.has(s)).map((s) => this.trackers.get(s));
    const requests = [];
    for (const tracker of chosen) {
      const paused = this.outlets.get(tracker.subject).paused;
      if (tracker.requestedIn !== sessionId && !tracker.denied && !paused) {
        tracker.requestedIn = sessionId;
        requests.push(tracker.request());
      }
    }
    return requests;
  }

  /** These requests went out on session `sessionId` (answers are now due). */
  sent(sessionId, requests) {
    for (const request of requests) this.trackers.get(request.subject)?.sent(sessionId);
  }

  /** The application took half of a paused subscription's buffer: its subjects are to
   * be subscribed again from their positions (returned). */
  resume(outlet) {
    outlet.paused = false;
    const subjects = this.subjectsOf(outlet);
    for (const subject of subjects) {
      const tracker = this.trackers.get(subject);
      tracker.recovering = true; // messages sent before the pause may still come
      tracker.requestedIn = -1;
    }
    return subjects;
  }

  pause(outlet) {
    outlet.paused = true;
    const subjects = this.subjectsOf(outlet);
    for (const subject of subjects) {
      const tracker = this.trackers.get(subject);
      tracker.skip();
      tracker.requestedIn = -1;
    }
    return subjects;
  }

  subjectsOf(outlet) {
    return [...this.outlets].filter(([, o]) => o === outlet).map(([s]) => s);
  }

  // --- server operations ------------------------------------------------------

  /** Hand over what is new, without waiting; returns {resubscribe: requests (gaps),
   * pause: subjects to unsubscribe (their subscription's buffer is full)}. */
  onMessages(messages) {
    const resubscribe = new Map();
    const pause = [];
    for (const message of messages) {
      const tracker = this.trackers.get(message.subject);
      if (tracker === undefined) continue; // unsubscribed meanwhile
      const outlet = this.outlets.get(message.subject);
      if (outlet.paused) continue; // comes again, as recovered, when it resumes
      if (outlet.full()) {
        pause.push(...this.pause(outlet));
        continue;
      }
      const verdict = tracker.onMessage(message);
      if (verdict === Verdict.DELIVER) outlet.push(message);
      else if (verdict === Verdict.GAP) resubscribe.set(tracker.subject, tracker.request());
    }
    for (const subject of pause) resubscribe.delete(subject);
    return { resubscribe: [...resubscribe.values()], pause };
  }

  /** Apply a subject status; returns the requests to send next (a subject of a
   * subscribe refused as too large, asked for alone), maybe none. */
  onSubjectStatus(op, server, sessionId = -1) {
    const tracker = this.trackers.get(op.subject);
    const lone = op.subject === this.aloneDue;
    if (lone && (tracker === undefined || answerComplete(op, tracker))) this.aloneDue = null;
    if (tracker === undefined) return this.nextAlone(sessionId);
    const before = tracker.position;
    const restarting = tracker.restarting;
    const skipped = tracker.onStatus(op.status, op.position, sessionId);
    const tooLarge = op.status === "SUBSCRIBE_DENY"
      && typeof op.reason === "string" && op.reason.startsWith(SUBSCRIBE_TOO_LARGE);
    if (tooLarge && (!lone || before !== null)) {
      tracker.denied = false; // not refused: asked for again, alone
      if (lone) { // a resume that can never fit: from the snapshot instead, next
        tracker.restart();
        this.alone.unshift(op.subject);
      } else {
        this.alone.push(op.subject);
      }
      return this.nextAlone(sessionId);
    }
    const at = (p) => `${p.epoch}:${p.seq}`;
    this.notify(skipped // the server lost messages: say so, as a resync does
      ? notification("DATA_RESYNC", { subject: op.subject, position: op.position, server,
        reason: `DATA_SYNC at ${at(op.position)} but the last message delivered was ${at(before)}` })
      : notification(op.status, {
        subject: op.subject, position: op.position, reason: op.reason, server,
      }));
    if (restarting && op.status === "SUBSCRIBE_ALLOW") { // from the snapshot: say so
      tracker.restarting = false;
      this.notify(notification("DATA_RESYNC", { subject: op.subject, position: op.position, server,
        reason: `${SUBSCRIBE_TOO_LARGE} to resume: the messages missed are left out` }));
    }
    return this.nextAlone(sessionId);
  }

  /** The next subject to ask for alone, once the answer before it is complete. */
  nextAlone(sessionId) {
    while (this.aloneDue === null && this.alone.length) {
      const subject = this.alone.shift();
      const tracker = this.trackers.get(subject);
      if (tracker === undefined || tracker.denied || this.outlets.get(subject).paused) continue;
      tracker.requestedIn = sessionId;
      this.aloneDue = subject;
      return [tracker.request()];
    }
    return [];
  }

  /** publish() stopped waiting for `closure`'s status (its timeout): should it come
   * after all, it is told once, as a notification carrying the closure. */
  givenUp(closure) {
    this.givenUpClosures.add(closure);
    for (const oldest of this.givenUpClosures) {
      if (this.givenUpClosures.size <= GIVEN_UP_REMEMBERED) break;
      this.givenUpClosures.delete(oldest);
    }
  }

  /** A server operation of no version this client speaks: counted, logged the first
   * time, otherwise ignored -- the session goes on (closing it would bring the same
   * operation on the next session: a reconnect loop). Nothing is lost by it unnoticed:
   * a message it carried would leave a gap in its subject's positions, which resumes
   * the subject. */
  onUnknownOp(name, server) {
    const key = this.unknownOps.has(name) || this.unknownOps.size < UNKNOWN_OPS_NAMED
      ? name : OTHER_UNKNOWN_OPS;
    const seen = this.unknownOps.get(key) ?? 0;
    this.unknownOps.set(key, seen + 1);
    if (seen === 0) {
      console.warn(`${server}: ignored a server operation of no protocol version `
        + `${PROTOCOL_VERSION} knows: '${key}'`);
    }
  }

  /** The one status of a publish: its publish()'s result; a notification for a publish
   * without closure (publishNoWait), or once for one given up. A status for a closure
   * already answered, or never made by this client, is a server's mistake: dropped
   * (counted in strayPublishStatuses), never a second status. */
  onPublishStatus(op, server) {
    const pending = op.closure === null ? undefined : this.pending.get(op.closure);
    if (pending === undefined) {
      if (op.closure !== null && !this.givenUpClosures.delete(op.closure)) {
        this.strayPublishStatuses += 1;
        return;
      }
      this.notify(notification(op.status, {
        subject: op.subject, position: op.position, reason: op.reason, server, closure: op.closure,
      }));
      return;
    }
    this.pending.delete(op.closure);
    if (op.status === "PUBLISH_OK") {
      pending.resolve(Object.freeze({ status: op.status, subject: op.subject, position: op.position }));
    } else {
      pending.reject(publishError(op.status, op.subject, op.reason));
    }
  }

  // --- session life -------------------------------------------------------------

  /** Every publish still waiting has an unknown outcome now, unless the server said
   * (close 4502 DRAINED, every frame before it read) that it answered every publish it
   * took: then those still waiting were not taken and fail definitely. */
  sessionLost(reason, { untakenFailed = false } = {}) {
    for (const pending of this.pending.values()) {
      if (untakenFailed) {
        pending.reject(publishError("PUBLISH_FAILED", pending.subject, `not published: ${reason}`));
      } else {
        pending.reject(new PublishOutcomeUnknown(pending.subject, pending.closure, reason));
      }
    }
    this.pending.clear();
    this.alone = []; // the next session asks for every subject again
    this.aloneDue = null;
    for (const tracker of this.trackers.values()) tracker.onSessionLost();
  }

  /** The client ended: subscriptions drain then end (with `error` if any). */
  close(error) {
    this.sessionLost("the client ended");
    for (const outlet of new Set(this.outlets.values())) outlet.end(error);
    this.outlets.clear();
  }
}

/** Whether `op` ends the answer to a subscription of `tracker`'s subject: its DATA_SYNC /
 * DATA_RESYNC on a resume, a deny, or -- on a first subscribe, whose messages follow it
 * at once -- the SUBSCRIBE_ALLOW. */
function answerComplete(op, tracker) {
  return op.status !== "SUBSCRIBE_ALLOW" || tracker.position === null;
}
