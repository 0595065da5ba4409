// A subscription: the application's end of the messages of some subjects, in order per
// subject, without duplicates or gaps.
//
// Either a callback (`onMessage`, called for each message as it arrives) or an async
// iterator (`for await (const message of subscription)`). Iterated messages wait in a
// bounded buffer; when the application does not read and the buffer is full, the
// subscription pauses: its subjects are left at the server, and once the application
// has taken half of the buffer they are subscribed again from the last message put into
// it, so the rest comes as recovered: nothing lost or duplicated, only later.

export class Subscription {
  constructor({ subjects, capacity, onMessage, unsubscribe, resume }) {
    this.subjects = Object.freeze([...subjects]);
    this.capacity = capacity;
    this.onMessage = onMessage;
    this.unsubscribeFn = unsubscribe;
    this.resumeFn = resume;
    this.active = true;
    this.paused = false;
    this.buffer = [];
    this.waiters = [];
    this.ended = false;
    this.error = null;
  }

  // --- the router's side (the outlet) --------------------------------------------

  full() {
    return this.onMessage === undefined && this.buffer.length >= this.capacity;
  }

  push(message) {
    if (this.ended) return;
    if (this.onMessage !== undefined) {
      try {
        this.onMessage(message);
      } catch (error) { // the application's bug must not stop the session's reader
        reportLater(error);
      }
      return;
    }
    const waiter = this.waiters.shift();
    if (waiter !== undefined) waiter.resolve({ value: message, done: false });
    else this.buffer.push(message);
  }

  /** No more messages: iterators drain the buffer, then end (or throw `error`). */
  end(error = null) {
    if (this.ended) return;
    this.ended = true;
    this.active = false;
    this.error = error;
    for (const waiter of this.waiters.splice(0)) settleEnd(waiter, error);
  }

  // --- the application's side ----------------------------------------------------

  /** The next message: {value, done}; rejects with the client's error if it ended
   * with one (after the buffer is drained). */
  next() {
    if (this.buffer.length) {
      const message = this.buffer.shift();
      if (this.paused && this.buffer.length <= Math.floor(this.capacity / 2)) {
        this.resumeFn(this);
      }
      return Promise.resolve({ value: message, done: false });
    }
    if (this.ended) {
      return this.error ? Promise.reject(this.error) : Promise.resolve({ value: undefined, done: true });
    }
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  async return() {
    await this.unsubscribe();
    return { value: undefined, done: true };
  }

  [Symbol.asyncIterator]() {
    return this;
  }

  /** Stop the subjects' messages; buffered messages are discarded. Idempotent. */
  async unsubscribe() {
    if (!this.active) return;
    this.buffer.length = 0;
    this.end(null);
    await this.unsubscribeFn(this);
  }
}

function settleEnd(waiter, error) {
  if (error) waiter.reject(error);
  else waiter.resolve({ value: undefined, done: true });
}

function reportLater(error) {
  if (typeof globalThis.reportError === "function") globalThis.reportError(error);
  else setTimeout(() => { throw error; });
}
