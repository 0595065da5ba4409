// The heartbeat (keepalive.heartbeat, docs/protocol.md "Heartbeats") on node's WebSocket
// against a scripted server on a real socket: `connect` asks for one; a server that
// granted one and then sends nothing for twice the interval is left ("nothing from the
// server"), with no ping's round trip -- the pings here come once a minute, so a session
// ended within the hang guard was ended by the silence. The Python SDK's twin:
// tests/client/test_sdk_heartbeat.py.

import assert from "node:assert/strict";
import { test } from "node:test";

import { connect } from "../src/index.js";
import { FakeServer } from "./support/fake_server.js";

const GUARD = { timeout: 10_000 }; // a hang guard, not a speed assertion
const RECONNECT = { initialDelay: 0.02, maxDelay: 0.05, jitter: 0, connectTimeout: 0.5 };
const SLOW_PINGS = { interval: 60, timeout: 60, heartbeat: 0.2 };

const pause = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

async function until(condition) {
  while (!condition()) await pause(5);
}

function open(servers, keepalive) {
  const client = connect(servers, { WebSocket: globalThis.WebSocket, reconnect: RECONNECT,
    ...(keepalive === undefined ? {} : { keepalive }) });
  const notes = [];
  client.onNotification((n) => notes.push(n));
  return { client, notes };
}

/** The next connection's `connect`, answered with `heartbeat` ms granted (or none). */
async function granted(server, heartbeat) {
  const conn = await server.nextConnection();
  const connect = await conn.expect("connect");
  const reply = { op: "connected", server: "fake", version: 1 };
  if (heartbeat !== null) reply.heartbeat = heartbeat;
  conn.send(reply);
  return { conn, connect };
}

const down = (notes) => notes.find((n) => n.status === "SERVER_DOWN");

test("connect asks for the keepalive's heartbeat, 2 s by default", GUARD, async () => {
  const server = await FakeServer.start();
  for (const [keepalive, asked] of [[undefined, 2000], [{ heartbeat: null }, undefined]]) {
    const { client } = open([server.url], keepalive);
    try {
      const { connect } = await granted(server, null);
      assert.equal(connect.heartbeat, asked);
    } finally {
      await client.close();
    }
  }
  server.close();
});

test("a server silent past twice the heartbeat is left for the next", GUARD, async () => {
  const server = await FakeServer.start();
  const { client, notes } = open([server.url], SLOW_PINGS);
  try {
    const { conn } = await granted(server, 200); // then silent: closes nothing
    conn.stopReading();
    await until(() => down(notes));
    assert.match(down(notes).reason, /nothing from the server for 0.4 s/);
    await granted(server, 200);
    await until(() => notes.filter((n) => n.status === "SERVER_UP").length === 2);
  } finally {
    await client.close();
    server.close();
  }
});

test("heartbeats keep an idle session, and their end ends it", GUARD, async () => {
  const server = await FakeServer.start();
  const { client, notes } = open([server.url], SLOW_PINGS);
  try {
    const { conn } = await granted(server, 200);
    for (let i = 0; i < 20; i += 1) { // 2 s: five times the silence that ends a session
      await pause(100);
      conn.send({ op: "pong" });
    }
    assert.equal(down(notes), undefined);
    await until(() => down(notes));
    assert.match(down(notes).reason, /nothing from the server/);
  } finally {
    await client.close();
    server.close();
  }
});

test("a grant below the ask is held to the ask; no grant or no ask: pings alone", GUARD,
  async () => {
    const server = await FakeServer.start();
    let { client, notes } = open([server.url], { interval: 60, timeout: 60, heartbeat: 0.3 });
    try {
      await granted(server, 1); // a broken server's 1 ms
      await until(() => down(notes));
      assert.match(down(notes).reason, /nothing from the server for 0.6 s/);
    } finally {
      await client.close();
    }
    for (const [keepalive, grant] of [[SLOW_PINGS, null], [{ ...SLOW_PINGS, heartbeat: null }, 100]]) {
      ({ client, notes } = open([server.url], keepalive));
      try {
        await granted(server, grant);
        await pause(1000); // 5 and 10 times what a grant would have allowed
        assert.equal(down(notes), undefined);
      } finally {
        await client.close();
      }
    }
    server.close();
  });

test("a heartbeat does not answer a ping", GUARD, async () => {
  // a server that writes heartbeats but never answers: the ping still finds it out
  const server = await FakeServer.start();
  const { client, notes } = open([server.url], { interval: 0.2, timeout: 0.3, heartbeat: 0.1 });
  let beating = null;
  try {
    const { conn } = await granted(server, 100);
    conn.autoPong = false;
    beating = setInterval(() => conn.send({ op: "pong" }), 50);
    await until(() => down(notes));
    assert.match(down(notes).reason, /no pong/);
  } finally {
    clearInterval(beating);
    await client.close();
    server.close();
  }
});

test("a client whose wall clock steps back still leaves a silent server", GUARD, async () => {
  // the silence was measured with Date.now: an hour back, it never reached the limit
  // for the hour (no "nothing from the server", no failover); now a monotonic clock
  const server = await FakeServer.start();
  const { client, notes } = open([server.url], SLOW_PINGS);
  const wall = Date.now;
  try {
    const { conn } = await granted(server, 200);
    conn.stopReading();
    await until(() => notes.some((n) => n.status === "SERVER_UP")); // the silence watched
    await pause(60); // (a look or two of it: every 0.1 s)
    Date.now = () => wall() - 3_600_000;
    const left = await Promise.race([until(() => down(notes)).then(() => true),
      pause(3000).then(() => false)]);
    assert.ok(left, "a silent server not left within 3 s of a 0.4 s limit");
    assert.match(down(notes).reason, /nothing from the server for 0.4 s/);
  } finally {
    Date.now = wall;
    await client.close();
    server.close();
  }
});
