// Client notifications: listeners, and a bounded queue for async iteration that never
// blocks the client -- when nobody reads, the oldest are dropped (counted in `dropped`).
// Notifications are informational: the messages carry the guarantee.

export class Notifications {
  constructor(capacity) {
    this.capacity = capacity;
    this.listeners = new Set();
    this.items = [];
    this.waiters = [];
    this.dropped = 0;
    this.closed = false;
    this.error = null;
  }

  /** Call `listener(notification)` for each from now on; returns a function to stop. */
  listen(listener) {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  put(notification) {
    for (const listener of this.listeners) {
      try {
        listener(notification);
      } catch (error) {
        setTimeout(() => { throw error; });
      }
    }
    if (this.closed) return;
    const waiter = this.waiters.shift();
    if (waiter !== undefined) {
      waiter.resolve({ value: notification, done: false });
      return;
    }
    if (this.items.length >= this.capacity) {
      this.items.shift();
      this.dropped += 1;
    }
    this.items.push(notification);
  }

  close(error = null) {
    this.closed = true;
    this.error = error;
    for (const waiter of this.waiters.splice(0)) {
      if (error) waiter.reject(error);
      else waiter.resolve({ value: undefined, done: true });
    }
  }

  next() {
    if (this.items.length) return Promise.resolve({ value: this.items.shift(), done: false });
    if (this.closed) {
      return this.error ? Promise.reject(this.error) : Promise.resolve({ value: undefined, done: true });
    }
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  [Symbol.asyncIterator]() {
    return this;
  }
}
