// The reconnect loop on real timers (node's WebSocket, a scripted server on 127.0.0.1):
// waits longer than setTimeout takes (2^31 - 1 ms, 24.8 days: a longer one fires after
// 1 ms) are not turned into a 1 ms loop; a member that refuses the connection is left
// at once; a client closed in the middle of a back-off or of a token provider's wait
// leaves no timer behind: the process exits by itself. About 3 s in all. (Closed while
// a silent member holds its upgrade, the process exits ~4 s later: node's WebSocket,
// undici, keeps that socket; not a timer of the SDK.)

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import net from "node:net";
import { test } from "node:test";

import { connect } from "../src/index.js";
import { FakeServer } from "./support/fake_server.js";

const MONTH = 30 * 24 * 3600; // seconds: more than setTimeout's 24.8 days
const settle = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

/** A port nothing listens on: connections to it are refused at once. */
async function closedPort() {
  const listener = net.createServer().listen(0, "127.0.0.1");
  await new Promise((resolve) => { listener.on("listening", resolve); });
  const { port } = listener.address();
  await new Promise((resolve) => { listener.close(resolve); });
  return port;
}

function open(servers, options) {
  const client = connect(servers, { WebSocket: globalThis.WebSocket, ...options });
  const notes = [];
  client.onNotification((n) => notes.push(n));
  return { client, notes };
}

test("a back-off longer than setTimeout takes waits; it is not a 1 ms loop", async () => {
  // before: 5,592 attempts a minute (benchmarks/sdk_refused_reconnect.py, --delays 3e6 3e6 0)
  const { client, notes } = open([`ws://127.0.0.1:${await closedPort()}`], {
    reconnect: { initialDelay: MONTH, maxDelay: MONTH, jitter: 0 },
  });
  await settle(400);
  assert.equal(notes.filter((n) => n.status === "SERVER_DOWN").length, 1, JSON.stringify(notes));
  await client.close();
});

test("a member that refuses the connection is left at once, saying so", async () => {
  const { client, notes } = open([`ws://127.0.0.1:${await closedPort()}`], {
    reconnect: { connectTimeout: 30, initialDelay: 20, maxDelay: 20 },
  });
  await settle(1000);
  // before, in node 20 (undici: an `error`, no `close`): nothing for connectTimeout, then
  // "cannot connect: no WebSocket connection within 30 s"
  assert.equal(notes.length, 1, JSON.stringify(notes));
  assert.match(notes[0].reason, /^cannot connect: the WebSocket connection failed/);
  await client.close();
});

test("a connectTimeout or keepalive longer than setTimeout takes is not 1 ms", async () => {
  const silent = await FakeServer.start({ upgrade: false });
  const waiting = open([silent.url], { reconnect: { connectTimeout: MONTH } });
  const server = await FakeServer.start();
  const live = open([server.url], { keepalive: { interval: MONTH, timeout: MONTH, heartbeat: null } });
  const conn = await server.nextConnection();
  await conn.acceptSession();
  await settle(400);
  assert.deepEqual(waiting.notes, []); // before: "no WebSocket connection within 2592000 s"
  assert.equal(live.client.live?.pingId, 0); // before: a ping every millisecond
  await Promise.all([waiting.client.close(), live.client.close()]);
  silent.close();
  server.close();
});

const CHILD = `
import { connect } from "./src/index.js";
const mode = process.argv[1];
const options = { WebSocket: globalThis.WebSocket, reconnect: { connectTimeout: 30 } };
const servers = ["ws://127.0.0.1:9"]; // discard: nothing listens (refused, or a bad port)
if (mode === "token") options.tokenProvider = () => new Promise(() => {}); // never answers
const client = connect(servers, options);
setTimeout(() => client.close(), 150); // backoff: in the 0.25-0.5 s wait after the refusal
`;

for (const mode of ["backoff", "token"]) {
  test(`a client closed during a ${mode} wait lets the process exit`, () => {
    const started = performance.now();
    const child = spawnSync(process.execPath, ["--experimental-websocket", "--input-type=module",
      "-e", CHILD, mode], { cwd: new URL("..", import.meta.url), timeout: 20_000,
      encoding: "utf8" });
    const took = performance.now() - started;
    assert.equal(child.status, 0, `${child.signal ?? ""} ${child.stderr}`);
    assert.ok(took < 5000, `${took} ms`); // before (token): 30 s, the connectTimeout
  });
}
