// What the client tests share: a client on the fake WebSocket with mocked timers.

import { afterEach, beforeEach, mock } from "node:test";

import { connect } from "../../src/index.js";
import { FakeWebSocket } from "./fake_websocket.js";
import { seeded } from "./random.js";

export const SUBJECT = "/Scores/NBA/LAL";
export const FAST = { initialDelay: 0.1, maxDelay: 0.1, jitter: 0, connectTimeout: 1 };

/** Fresh fake sockets and mocked setTimeout for every test of the calling file. */
export function useFakes() {
  beforeEach(() => {
    FakeWebSocket.reset();
    mock.timers.enable({ apis: ["setTimeout"] });
  });
  afterEach(() => mock.timers.reset());
}

export function open(options = {}) {
  const client = connect(["100 ws://a:1", "1 ws://b:1"], {
    WebSocket: FakeWebSocket, random: seeded(3), reconnect: FAST, ...options,
  });
  const notes = [];
  client.onNotification((n) => notes.push(n));
  return { client, notes };
}

export const flush = () => new Promise((resolve) => setImmediate(resolve));

export async function take(subscription, count) {
  const got = [];
  for (let i = 0; i < count; i += 1) got.push((await subscription.next()).value);
  return got;
}
