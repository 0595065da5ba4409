import assert from "node:assert/strict";
import { test } from "node:test";

import { Backoff, reconnectPolicy } from "../src/index.js";

test("delays double up to maxDelay, without jitter", () => {
  const backoff = new Backoff(reconnectPolicy({ initialDelay: 0.5, maxDelay: 4, jitter: 0 }), () => 0.9);
  assert.deepEqual(Array.from({ length: 6 }, () => backoff.nextDelay()), [0.5, 1, 2, 4, 4, 4]);
  assert.equal(backoff.failures, 6);
  backoff.reset();
  assert.equal(backoff.nextDelay(), 0.5);
});

test("jitter shortens a delay by up to its fraction", () => {
  const policy = reconnectPolicy({ initialDelay: 1, maxDelay: 1, jitter: 0.5 });
  assert.equal(new Backoff(policy, () => 0).nextDelay(), 1);
  assert.equal(new Backoff(policy, () => 0.5).nextDelay(), 0.75);
  const low = new Backoff(policy, () => 0.999999).nextDelay();
  assert.ok(low > 0.5 && low < 0.5001, String(low));
});

test("maxAttempts consecutive failures exhaust it; a good session resets", () => {
  const backoff = new Backoff(reconnectPolicy({ maxAttempts: 2 }), () => 0);
  backoff.nextDelay();
  assert.equal(backoff.exhausted(), false);
  backoff.nextDelay();
  assert.equal(backoff.exhausted(), true);
  backoff.reset();
  assert.equal(backoff.exhausted(), false);
  assert.equal(new Backoff(reconnectPolicy(), () => 0).exhausted(), false);
});

test("bad policies are refused, naming the key", () => {
  assert.throws(() => reconnectPolicy({ initalDelay: 1 }), /unknown key\(s\) initalDelay/);
  assert.throws(() => reconnectPolicy({ initialDelay: 0 }), /initialDelay/);
  assert.throws(() => reconnectPolicy({ initialDelay: 5, maxDelay: 1 }), /initialDelay <= maxDelay/);
  assert.throws(() => reconnectPolicy({ multiplier: 0.5 }), /multiplier/);
  assert.throws(() => reconnectPolicy({ jitter: 2 }), /jitter/);
  assert.throws(() => reconnectPolicy({ maxAttempts: 0 }), /maxAttempts/);
  assert.throws(() => reconnectPolicy({ connectTimeout: 0 }), /connectTimeout/);
  assert.throws(() => reconnectPolicy({ healthyAfter: 0 }), /healthyAfter/);
  assert.throws(() => reconnectPolicy({ healthyAfter: NaN }), /healthyAfter/);
  assert.equal(reconnectPolicy().healthyAfter, 5);
});
