// Per-subject resume state: what was delivered, what is a duplicate, what is a gap.
// Sans-I/O, the same rules as the Python SDK (migratory_client/resume.py and
// docs/protocol.md, "Positions"):
//
// * `position` is the last position delivered to the application, or the position to
//   start from that the server gave (SUBSCRIBE_ALLOW on a first subscribe, DATA_SYNC /
//   DATA_RESYNC after a resume).
// * Messages of type update / recovered of the same epoch with seq <= position.seq are
//   duplicates and dropped, as are those of an epoch left behind at or below the highest
//   seq reached in it (`highest`); seq == position.seq + 1 is delivered. A higher seq is a gap
//   (unless the subscription is conflated, where skipping is the point): the message is
//   not delivered and the subject is resubscribed from `position`, so the missing
//   messages come back as recovered.
// * A message of another epoch starts a new lineage and is delivered when it is that
//   lineage's first (seq 1; any seq on a conflated subscription). Further on, the
//   messages before it are missing, or it is a stale one of a lineage left behind: a
//   gap, as above, and the resume from `position` gets the server's DATA_SYNC or snapshot
//   and DATA_RESYNC, never a silent jump into the middle of an epoch.
// * snapshot and historical messages do not move `position`. They belong to the answer
//   to a subscribe, which a SUBSCRIBE_ALLOW opens and the first update / recovered or
//   DATA_SYNC / DATA_RESYNC closes: one snapshot, or up to `history` historical messages
//   (a first subscribe), in order. Any other (a server's mistake: a snapshot again
//   mid-stream, a history replayed) is dropped, or the application would get an old
//   message after newer ones, or one twice.
// * Before the SUBSCRIBE_ALLOW of a first subscribe (no position yet), an update is
//   dropped: the server answers first, so it belongs to an earlier subscription of the
//   subject on this connection, unsubscribed since.
// * A DATA_SYNC says every message up to its position was sent: one that moves
//   `position` past messages never delivered (a server that lost some) is told to the
//   application as DATA_RESYNC, never a silent gap.
// * DATA_SYNC / DATA_RESYNC move `position` only when they answer the latest request:
//   the server answers one connection's requests in order (each with one
//   SUBSCRIBE_ALLOW or SUBSCRIBE_DENY first), so while a later request is unanswered a
//   status belongs to an earlier one whose messages may have been dropped since. After
//   messages were skipped (a paused subscription), no status moves `position` until a
//   request sent since then is answered.

import { MessageType, position as makePosition } from "./codec.js";

export const Verdict = Object.freeze({
  DELIVER: "deliver",
  DUPLICATE: "duplicate", // already delivered (or will come again as recovered): drop it
  GAP: "gap", // messages are missing before this one: drop it, resubscribe from position
});

const PASS_THROUGH = new Set([MessageType.SNAPSHOT, MessageType.HISTORICAL]);
const CONFLATION_UNIT_MS = 100;
/** Epochs of one subject whose highest seq a tracker keeps (the most recent). */
export const EPOCHS_REMEMBERED = 16;

/** Resume state of one subscribed subject. */
export class SubjectTracker {
  constructor(subject, { history = 0, conflationMs = 0, position = null } = {}) {
    this.subject = subject;
    this.history = history;
    this.conflationMs = conflationMs;
    this.position = position;
    this.denied = false;
    /** A resubscribe after a gap is under way; later gaps are expected, not new. */
    this.recovering = false;
    /** Id of the session on which this subject was last subscribed. */
    this.requestedIn = -1;
    /** Requests sent on session `dueIn` that the server has not answered yet. */
    this.answersDue = 0;
    this.dueIn = -1;
    /** Messages after `position` were dropped (a paused subscription): no status may
     * move `position` until the server answers a request sent since. */
    this.skipping = false;
    this.askedSinceSkip = false;
    /** The resume's answer could never fit in the client's outbox: the subject starts
     * again from the snapshot (a first subscribe without history), a resync to announce. */
    this.restarting = false;
    /** A subscribe's answer is open and has not had its snapshot yet. */
    this.snapshotDue = false;
    /** Historical messages the open answer may still bring, and the last one's position. */
    this.historicalDue = 0;
    this.lastHistorical = null;
    /** A first subscribe's answer (no history) is open and its snapshot has not come:
     * should the connection be lost now, the resume asks for the snapshot as of
     * `position` (the subscribe entry's `snapshot` key), or the application never gets it. */
    this.snapshotOwed = false;
    /** As `snapshotOwed`, for a first subscribe with history: the historical messages it
     * has not had yet, asked for again (as of `position`) by the resume. */
    this.historicalOwed = 0;
    /** The highest seq `position` reached in each epoch it was in (the last
     * EPOCHS_REMEMBERED): positions are never reused, so a message at or below it was
     * delivered already (or precedes where the server started the subject), whatever
     * epoch a status moved `position` to since -- a server that goes back to a lineage
     * left behind gets no duplicate through. */
    this.highest = new Map();
  }

  get conflated() {
    return this.conflationMs >= CONFLATION_UNIT_MS;
  }

  /** The subscription to send: a resume from `position` once there is one. */
  request() {
    if (this.position === null) {
      return Object.freeze({
        subject: this.subject, position: null, history: this.restarting ? 0 : this.history,
        conflationMs: this.conflationMs,
      });
    }
    return Object.freeze({
      subject: this.subject, position: this.position, history: this.historicalOwed,
      conflationMs: this.conflationMs, snapshot: this.snapshotOwed,
    });
  }

  /** A subscription request for this subject went out on session `sessionId`. */
  sent(sessionId) {
    if (this.dueIn !== sessionId) {
      this.dueIn = sessionId;
      this.answersDue = 0;
    }
    this.answersDue += 1;
    this.askedSinceSkip = this.skipping;
  }

  /** Give up the resume: subscribe again from the snapshot (see `restarting`). */
  restart() {
    this.position = null;
    this.restarting = true;
    this.recovering = false;
  }

  /** Messages of this subject are being dropped from now on (a paused subscription). */
  skip() {
    this.skipping = true;
    this.askedSinceSkip = false;
    this.recovering = false;
  }

  /** Apply a subject status that arrived on session `sessionId`. Returns true for a
   * DATA_SYNC that moved `position` past messages never delivered (the server said it
   * sent every message up to it, and did not): a gap to announce. */
  onStatus(status, position, sessionId = -1) {
    const awaited = this.dueIn === sessionId && this.answersDue > 0;
    if ((status === "SUBSCRIBE_ALLOW" || status === "SUBSCRIBE_DENY") && awaited) {
      this.answersDue -= 1;
      if (this.answersDue === 0 && this.askedSinceSkip) {
        this.skipping = false;
        this.askedSinceSkip = false;
      }
    }
    if (status === "SUBSCRIBE_DENY") {
      this.denied = true;
    } else if (status === "SUBSCRIBE_ALLOW") {
      this.allowed(position);
    } else if (status === "DATA_SYNC" || status === "DATA_RESYNC") {
      this.closeAnswer();
    }
    if ((status === "DATA_SYNC" || status === "DATA_RESYNC") && !(awaited || this.skipping)) {
      this.recovering = false;
      if (position !== null && position !== undefined) {
        const skipped = status === "DATA_SYNC" && this.skipsTo(position);
        this.continueFrom(position);
        return skipped;
      }
    }
    return false;
  }

  /** A SUBSCRIBE_ALLOW opens the answer: on a first subscribe, its snapshot or history,
   * and `position` to start from; on a resume, what a first answer cut short still owes
   * (`snapshotOwed`, `historicalOwed`), or the snapshot of a DATA_RESYNC -- recovered
   * messages come next. */
  allowed(position) {
    this.denied = false;
    if (this.position === null) {
      const history = this.restarting ? 0 : this.history;
      this.snapshotDue = history === 0;
      this.historicalDue = history;
      this.snapshotOwed = history === 0;
      this.historicalOwed = history;
      this.lastHistorical = null;
      if (position !== null && position !== undefined) this.move(position);
    } else { // (after the historical messages already delivered, if any)
      this.snapshotDue = true;
      this.historicalDue = this.historicalOwed;
    }
  }

  skipsTo(position) {
    const last = this.position;
    if (last === null || this.conflated) return false;
    if (last.epoch !== position.epoch) return position.seq > 0; // its messages never came
    return position.seq > last.seq;
  }

  continueFrom(position) {
    // Within one epoch never move back: positions are never reused, so anything at or
    // below what was delivered is the same message again.
    this.move(position);
  }

  /** `position` becomes the position, or the highest reached in its epoch. */
  move(position) {
    const top = this.highest.get(position.epoch) ?? -1;
    const seq = Math.max(top, position.seq);
    this.highest.delete(position.epoch);
    this.highest.set(position.epoch, seq); // (again) the most recent
    if (this.highest.size > EPOCHS_REMEMBERED) {
      this.highest.delete(this.highest.keys().next().value);
    }
    this.position = seq === position.seq ? position : makePosition(position.epoch, seq);
  }

  closeAnswer() {
    this.snapshotDue = false;
    this.historicalDue = 0;
    this.snapshotOwed = false;
    this.historicalOwed = 0;
  }

  /** A snapshot at or before the highest position reached in its epoch, on a
   * subscription that began with the snapshot and was not owed one: every retained message
   * it merges reached the application already (in that first snapshot or as an update), so
   * it would only bring old state back after newer (a resume's snapshot from a server that
   * then says DATA_SYNC, or one cache-expired behind the position: DATA_RESYNC tells the
   * application that much). */
  stale(message) {
    return !this.snapshotOwed && this.history === 0
      && message.seq <= (this.highest.get(message.epoch) ?? -1);
  }

  /** A snapshot or historical message: delivered only as part of an open answer. */
  answerMessage(message) {
    if (message.type === MessageType.SNAPSHOT) {
      if (!this.snapshotDue || this.stale(message)) return Verdict.DUPLICATE;
      this.snapshotDue = false;
      this.snapshotOwed = false;
      return Verdict.DELIVER;
    }
    const last = this.lastHistorical;
    if (this.historicalDue === 0
      || (last !== null && last.epoch === message.epoch && message.seq <= last.seq)) {
      return Verdict.DUPLICATE;
    }
    this.historicalDue -= 1;
    this.historicalOwed = Math.max(0, this.historicalOwed - 1);
    this.lastHistorical = makePosition(message.epoch, message.seq);
    return Verdict.DELIVER;
  }

  /** Decide about one message of this subject and advance `position` if delivered. */
  onMessage(message) {
    if (PASS_THROUGH.has(message.type)) return this.answerMessage(message);
    this.closeAnswer(); // what belongs to the answer comes before any update
    const arrived = makePosition(message.epoch, message.seq);
    const last = this.position;
    // (in the current epoch: at or before `position`)
    if (arrived.seq <= (this.highest.get(arrived.epoch) ?? -1)) return Verdict.DUPLICATE;
    if (last === null) {
      // before the first subscribe's SUBSCRIBE_ALLOW: a message of an earlier
      // subscription of the subject, unsubscribed since
      if (this.answersDue > 0) return Verdict.DUPLICATE;
      this.move(arrived);
      return Verdict.DELIVER;
    }
    if (arrived.epoch !== last.epoch) {
      if (arrived.seq !== 1 && !this.conflated) return this.gap();
      this.move(arrived); // a new lineage, from its start
      return Verdict.DELIVER;
    }
    if (arrived.seq <= last.seq) return Verdict.DUPLICATE;
    if (arrived.seq === last.seq + 1 || this.conflated) {
      this.move(arrived);
      return Verdict.DELIVER;
    }
    return this.gap();
  }

  gap() {
    if (this.recovering) return Verdict.DUPLICATE;
    this.recovering = true;
    return Verdict.GAP;
  }

  /** The connection is gone; the next session resubscribes every subject anyway. A
   * first subscribe's answer cut after its SUBSCRIBE_ALLOW and before its snapshot (or
   * its history) is resumed from the ALLOW's position asking for the snapshot (the
   * historical messages not had) as of it (`snapshotOwed`, `historicalOwed`): they come,
   * then the updates missed (docs/protocol.md, "What the SDKs do with a broken server"). */
  onSessionLost() {
    this.recovering = false;
  }
}
