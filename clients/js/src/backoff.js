// Reconnect policy: exponential back-off with jitter, bounded, reset after a good session:
// one that stayed up `healthyAfter` seconds after `connected`, whatever ended it. A server
// that drops its sessions sooner (a crash loop, even one that answers pings) is backed off
// from, and such sessions count towards maxAttempts; so a client connects to it at most
// once per healthyAfter seconds. Same rule as the Python SDK (migratory_client/backoff.py).
// Pure: no I/O; the random source (a function returning [0, 1)) is injected.

const DEFAULT_POLICY = Object.freeze({
  initialDelay: 0.5, // seconds
  maxDelay: 30,
  multiplier: 2,
  jitter: 0.5, // 0 = none, 1 = anywhere down to 0
  maxAttempts: null, // consecutive failed attempts before ServerUnavailableError; null = never
  connectTimeout: 10, // WebSocket handshake plus the connect/connected exchange
  healthyAfter: 5, // seconds a session stays up after `connected` to reset the back-off
});

/** The policy with defaults filled in; the error names the bad key. */
export function reconnectPolicy(options = {}) {
  const unknown = Object.keys(options).filter((k) => !Object.hasOwn(DEFAULT_POLICY, k));
  if (unknown.length) throw new TypeError(`reconnect: unknown key(s) ${unknown.join(", ")}`);
  const p = { ...DEFAULT_POLICY, ...options };
  if (!(p.initialDelay > 0 && p.initialDelay <= p.maxDelay)) {
    throw new RangeError("reconnect: need 0 < initialDelay <= maxDelay");
  }
  if (!(p.multiplier >= 1)) throw new RangeError("reconnect: multiplier must be >= 1");
  if (!(p.jitter >= 0 && p.jitter <= 1)) throw new RangeError("reconnect: jitter must be within [0, 1]");
  if (p.maxAttempts !== null && !(Number.isInteger(p.maxAttempts) && p.maxAttempts >= 1)) {
    throw new RangeError("reconnect: maxAttempts must be an integer >= 1 or null");
  }
  if (!(p.connectTimeout > 0)) throw new RangeError("reconnect: connectTimeout must be > 0");
  if (!(p.healthyAfter > 0)) throw new RangeError("reconnect: healthyAfter must be > 0");
  return Object.freeze(p);
}

/** The delays before successive reconnect attempts. */
export class Backoff {
  constructor(policy, random) {
    this.policy = policy;
    this.random = random;
    this.base = policy.initialDelay;
    /** Consecutive failed attempts since the last successful session. */
    this.failures = 0;
  }

  /** Count one more failure and return the seconds to wait before the next attempt:
   * min(maxDelay, initialDelay * multiplier^n) shortened by up to `jitter` of it. */
  nextDelay() {
    this.failures += 1;
    const base = this.base;
    this.base = Math.min(this.policy.maxDelay, base * this.policy.multiplier);
    return base * (1 - this.policy.jitter * this.random());
  }

  /** A session proved good (it stayed up healthyAfter seconds): the next failure
   * starts from initialDelay again. */
  reset() {
    this.base = this.policy.initialDelay;
    this.failures = 0;
  }

  /** Whether maxAttempts consecutive attempts have failed. */
  exhausted() {
    const limit = this.policy.maxAttempts;
    return limit !== null && this.failures >= limit;
  }
}
