// The client on node's WebSocket against a hostile server on a real socket (127.0.0.1):
// frames that are not operations, messages nobody subscribed to, positions that go back
// or skip, a reset in the middle of a frame, members that take the connection and say
// nothing, a server that stops reading, a frame over the limit, publish statuses nobody
// asked for, close codes the table does not name, a DATA_SYNC before anything was
// recovered. What the application sees: no crash, no hang, no gap, no duplicate, one
// outcome per publish; the session is given up and another member tried.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Encoder, Tag } from "cbor-x";

import { NotConnectedError, PublishOutcomeUnknown, connect } from "../src/index.js";
import { Router, UNKNOWN_OPS_NAMED } from "../src/router.js";
import { MAX_BUFFERED_BYTES, MAX_FRAME_BYTES } from "../src/session.js";
import { FakeServer, bigEndian64, closeFrame, frame, opFrame } from "./support/fake_server.js";
import { batch, message, status, update } from "./support/fake_websocket.js";

const SUBJECT = "/a/b";
const GUARD = { timeout: 10_000 }; // a hang guard, not a speed assertion
// connectTimeout: 0.5 s left a session the fake server accepted late (load ~25, the mid
// CI of 19104a4: "expected subscribe, got null") for the next; 2 s is still a bound
const RECONNECT = { initialDelay: 0.02, maxDelay: 0.05, jitter: 0, connectTimeout: 2 };
const encoder = new Encoder({ useRecords: false, variableMapSize: true, tagUint8Array: false });

const pause = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

async function until(condition) {
  while (!condition()) await pause(5);
}

function open(servers, options = {}) {
  const client = connect(servers, {
    WebSocket: globalThis.WebSocket, reconnect: RECONNECT, ...options,
  });
  const notes = [];
  client.onNotification((n) => notes.push(n));
  return { client, notes };
}

/** `client` subscribes to SUBJECT; `server`'s next connection allows it at 7:`seq`. */
async function subscribedAt(server, client, seq = 10) {
  const subscription = client.subscribe(SUBJECT);
  const conn = await server.nextConnection();
  await conn.acceptSession();
  await conn.expect("subscribe");
  conn.send(status("SUBSCRIBE_ALLOW", SUBJECT, 7, seq));
  return { subscription, conn };
}

/** The client's next session resumes SUBJECT from 7:`seq` (asking for the snapshot as
 * of it when the first subscribe's answer was cut before one came). */
async function resumedFrom(server, seq, { snapshot = false } = {}) {
  const conn = await server.nextConnection();
  await conn.acceptSession();
  const { subjects } = await conn.expect("subscribe");
  const expected = { subject: SUBJECT, epoch: 7, seq };
  if (snapshot) expected.snapshot = true;
  assert.deepEqual(subjects, [expected]);
  return conn;
}

const recovered = (...seqs) => batch(seqs.map((s) => update(SUBJECT, s, { type: "recovered" })));
const seqs = async (subscription, count) => {
  const got = [];
  for (let i = 0; i < count; i += 1) {
    const { value } = await subscription.next();
    got.push(`${value.subject} ${value.type} ${value.seq}`);
  }
  return got;
};

const NOT_OPERATIONS = {
  "not CBOR": frame(Buffer.from([0xff, 0x00, 0x20, 0x6e])),
  "CBOR, not a map": frame(encoder.encode([1, 2, 3])),
  "unknown status": opFrame({ op: "status", status: "MAYBE", subject: SUBJECT }),
  "seq not an integer": opFrame({ ...message(SUBJECT, 11), seq: "11" }),
  "bytes after the map": frame(Buffer.concat([encoder.encode({ op: "pong" }), Buffer.from([0])])),
  "a message without its position": opFrame({ op: "message", subject: SUBJECT, content: new Uint8Array(1) }),
  // a server sends no CBOR tag, and epochs 1 <= epoch < 2^48 (was: both read)
  "a shared reference": frame(encoder.encode({ op: "batch", messages: [
    new Tag(message(SUBJECT, 12), 28), new Tag(0, 29)] })),
  "a message at epoch 0": opFrame({ ...message(SUBJECT, 12), epoch: 0 }),
  "a text frame": frame(Buffer.from("hello"), 0x1),
};

for (const [name, bad] of Object.entries(NOT_OPERATIONS)) {
  test(`a frame that is not an operation (${name}) ends the session, not the client`, GUARD, async () => {
    const server = await FakeServer.start();
    const { client, notes } = open([server.url]);
    try {
      const { subscription, conn } = await subscribedAt(server, client);
      conn.send(message(SUBJECT, 11));
      conn.write(Buffer.concat([bad, opFrame(message(SUBJECT, 12))])); // after it: not read
      const again = await resumedFrom(server, 11);
      again.send(status("SUBSCRIBE_ALLOW", SUBJECT), recovered(12), status("DATA_SYNC", SUBJECT, 7, 12));
      assert.deepEqual(await seqs(subscription, 2), ["/a/b update 11", "/a/b recovered 12"]);
      const down = notes.find((n) => n.status === "SERVER_DOWN");
      assert.match(down.reason, /^server broke the protocol: /);
      assert.equal(client.error, null);
    } finally {
      await client.close();
      server.close();
    }
  });
}

test("an op of no protocol version it knows is ignored and counted, the session goes on", GUARD, async () => {
  // was: closed the session ("server broke the protocol: unknown op 'teleport'"); a newer
  // server sending it on every session would have made the client reconnect in a loop
  const server = await FakeServer.start();
  const { client, notes } = open([server.url]);
  const warned = [];
  const warn = console.warn;
  console.warn = (line) => warned.push(line);
  try {
    const subscription = client.subscribe(SUBJECT);
    const conn = await server.nextConnection();
    await conn.expect("connect");
    conn.send({ op: "hello", from: "the future" }, { op: "connected", server: "fake", version: 1 });
    await conn.expect("subscribe");
    conn.send(
      status("SUBSCRIBE_ALLOW", SUBJECT, 7, 10), message(SUBJECT, 11),
      { op: "teleport", subject: SUBJECT, messages: [1, 2] }, message(SUBJECT, 12),
      { op: "teleport" }, batch([update(SUBJECT, 13)]),
    );
    assert.deepEqual(await seqs(subscription, 3), [11, 12, 13].map((s) => `/a/b update ${s}`));
    assert.deepEqual([...client.router.unknownOps], [["hello", 1], ["teleport", 2]]);
    assert.equal(warned.length, 2);
    assert.match(warned[1], /ignored a server operation of no protocol version 1 knows: 'teleport'/);
    assert.deepEqual(notes.map((n) => n.status), ["SERVER_UP", "SUBSCRIBE_ALLOW"]);
    assert.equal(server.connections.length, 1);
  } finally {
    console.warn = warn;
    await client.close();
    server.close();
  }
});

test("unknown ops beyond the named are counted together", () => {
  const router = new Router(() => {});
  const warn = console.warn;
  console.warn = () => {};
  try {
    for (let i = 0; i < UNKNOWN_OPS_NAMED + 5; i += 1) router.onUnknownOp(`op${i}`, "s");
    router.onUnknownOp("op0", "s");
  } finally {
    console.warn = warn;
  }
  assert.equal(router.unknownOps.size, UNKNOWN_OPS_NAMED + 1);
  assert.equal(router.unknownOps.get("op0"), 2);
  assert.equal(router.unknownOps.get("(others)"), 5);
});

test("messages never subscribed, back in time or after a skip are not delivered", GUARD, async () => {
  const server = await FakeServer.start();
  const { client } = open([server.url]);
  try {
    const { subscription, conn } = await subscribedAt(server, client);
    conn.send(
      batch([update(SUBJECT, 11), update("/x/y", 11)]),
      batch([update(SUBJECT, 12), update(SUBJECT, 11), update(SUBJECT, 9)]),
      batch([update(SUBJECT, 10), update(SUBJECT, 12)]),
      batch([update(SUBJECT, 15), update(SUBJECT, 16)]), // 13, 14 skipped
    );
    const { subjects } = await conn.expect("subscribe"); // the gap: resumed on this session
    assert.deepEqual(subjects, [{ subject: SUBJECT, epoch: 7, seq: 12 }]);
    conn.send(
      status("SUBSCRIBE_ALLOW", SUBJECT), recovered(13, 14, 15, 16),
      status("DATA_SYNC", SUBJECT, 7, 16), batch([update(SUBJECT, 16), update(SUBJECT, 17)]),
    );
    assert.deepEqual(await seqs(subscription, 7), [11, 12, 13, 14, 15, 16, 17].map(
      (s) => `/a/b ${s < 13 || s === 17 ? "update" : "recovered"} ${s}`));
    await pause(20);
    assert.equal(subscription.buffer.length, 0);
  } finally {
    await client.close();
    server.close();
  }
});

for (const cut of [1, 2, 9, -1]) {
  test(`a connection reset after ${cut} bytes of a frame resumes after the last whole one`, GUARD, async () => {
    const server = await FakeServer.start();
    const { client } = open([server.url]);
    try {
      const { subscription, conn } = await subscribedAt(server, client);
      conn.send(message(SUBJECT, 11));
      assert.deepEqual(await seqs(subscription, 1), ["/a/b update 11"]);
      conn.reset(opFrame(message(SUBJECT, 12)).subarray(0, cut));
      const again = await resumedFrom(server, 11);
      again.send(status("SUBSCRIBE_ALLOW", SUBJECT), recovered(12), status("DATA_SYNC", SUBJECT, 7, 12));
      assert.deepEqual(await seqs(subscription, 1), ["/a/b recovered 12"]);
    } finally {
      await client.close();
      server.close();
    }
  });
}

for (const silentAt of ["upgrade", "connect"]) {
  test(`a member silent at the ${silentAt} is left after connectTimeout for the next`, GUARD, async () => {
    const mute = await FakeServer.start({ upgrade: silentAt !== "upgrade" });
    const good = await FakeServer.start();
    const { client, notes } = open([`100 ${mute.url}`, `0 ${good.url}`]);
    try {
      const conn = await good.nextConnection();
      await conn.acceptSession();
      assert.equal(await client.waitConnected(), good.url);
      const down = notes.find((n) => n.status === "SERVER_DOWN");
      assert.equal(down.server, mute.url);
      assert.equal(down.reason, silentAt === "upgrade"
        ? "cannot connect: no WebSocket connection within 2 s"
        : "cannot connect: no 'connected' within 2 s");
    } finally {
      await client.close();
      mute.close();
      good.close();
    }
  });
}

test("publishes to a server that stops reading are held back, then go out on the next session", GUARD, async () => {
  // 100 publishes of 256 KiB to a member that reads nothing: the WebSocket took them all
  // (25 MiB held by the client for as long as the keepalive let the session live)
  const server = await FakeServer.start();
  const { client, notes } = open([server.url], { keepalive: { interval: 0.2, timeout: 1 } });
  try {
    const stalled = await server.nextConnection();
    await stalled.acceptSession();
    const session = await client.waitLive();
    stalled.stopReading();
    let mostBuffered = 0;
    const watch = setInterval(() => {
      mostBuffered = Math.max(mostBuffered, session.ws.bufferedAmount);
    }, 1);
    const on = []; // the session each publish went out on
    const all = Array.from({ length: 100 }, () => client.publishNoWait(SUBJECT,
      new Uint8Array(2 ** 18), { timeout: 8 }).then(() => on.push(client.live.id)));
    mostBuffered = Math.max(mostBuffered, session.ws.bufferedAmount);
    const next = await server.nextConnection(); // the stalled session was given up
    await next.acceptSession();
    await Promise.all(all);
    clearInterval(watch);
    assert.ok(mostBuffered < MAX_BUFFERED_BYTES + 2 ** 19, `${mostBuffered} bytes waited`); // was: 25 MiB
    const resent = on.filter((id) => id !== session.id).length;
    assert.ok(resent > 0 && resent + on.filter((id) => id === session.id).length === 100);
    for (let i = 0; i < resent; i += 1) await next.expect("publish");
    const down = notes.find((n) => n.status === "SERVER_DOWN");
    assert.equal(down.reason, "could not send for 1 s");
  } finally {
    await client.close();
    server.close();
  }
});

test("publishes held back by a server that stops reading go out in the order they were made", GUARD, async () => {
  const server = await FakeServer.start();
  const { client } = open([server.url], { keepalive: { interval: 60, timeout: 60 } });
  try {
    const conn = await server.nextConnection();
    await conn.acceptSession();
    await client.waitConnected();
    conn.stopReading();
    const all = [];
    for (let i = 0; i < 80; i += 1) {
      all.push(client.publishNoWait(SUBJECT, new Uint8Array(2 ** 18), { fields: { i: String(i) } }));
      if (i % 20 === 19) await pause(30); // some wait for room while later ones are made
    }
    conn.resumeReading();
    await Promise.all(all);
    const order = [];
    for (let i = 0; i < 80; i += 1) order.push(Number((await conn.expect("publish")).fields.i));
    assert.deepEqual(order, Array.from({ length: 80 }, (_, i) => i));
  } finally {
    await client.close();
    server.close();
  }
});

test("a publish that finds no room within its timeout is not sent", GUARD, async () => {
  const server = await FakeServer.start();
  const { client } = open([server.url], { keepalive: { interval: 60, timeout: 60 } });
  try {
    const conn = await server.nextConnection();
    await conn.acceptSession();
    await client.waitConnected();
    conn.stopReading();
    const outcomes = await Promise.all(Array.from({ length: 30 }, () => client.publish(SUBJECT,
      new Uint8Array(2 ** 20), { timeout: 0.3 }).then(() => "ok", (e) => e.constructor.name)));
    const notSent = outcomes.filter((o) => o === "NotConnectedError").length;
    assert.ok(notSent > 0, outcomes.join()); // was: every one written into the WebSocket
    assert.equal(notSent + outcomes.filter((o) => o === "PublishOutcomeUnknown").length, 30);
  } finally {
    await client.close();
    server.close();
  }
});

test("a frame over MAX_FRAME_BYTES loses the session before it is decoded", GUARD, async () => {
  const server = await FakeServer.start();
  const { client, notes } = open([server.url]);
  try {
    const { subscription, conn } = await subscribedAt(server, client);
    const huge = { ...message(SUBJECT, 11), content: new Uint8Array(MAX_FRAME_BYTES) };
    conn.write(opFrame(huge));
    const again = await resumedFrom(server, 10, { snapshot: true }); // was: decoded and delivered
    again.send(status("SUBSCRIBE_ALLOW", SUBJECT), recovered(11), status("DATA_SYNC", SUBJECT, 7, 11));
    assert.deepEqual(await seqs(subscription, 1), ["/a/b recovered 11"]);
    const down = notes.find((n) => n.status === "SERVER_DOWN");
    assert.match(down.reason, /^bad frame from the server \(1009 MESSAGE_TOO_BIG: \d+ bytes, more than 67108864\)$/);
  } finally {
    await client.close();
    server.close();
  }
});

test("each publish gets exactly one status, whatever the server answers", GUARD, async () => {
  const server = await FakeServer.start();
  const { client, notes } = open([server.url]);
  try {
    const conn = await server.nextConnection();
    await conn.acceptSession();
    await client.waitConnected();
    const answer = (closure, name = "PUBLISH_OK") => ({ op: "publish_status", status: name,
      subject: SUBJECT, ...(closure === null ? {} : { closure }),
      ...(name === "PUBLISH_OK" ? { epoch: 7, seq: 99 } : {}) });
    const first = client.publish(SUBJECT, "x", { timeout: 5 });
    const { closure } = await conn.expect("publish");
    conn.send(answer(`${closure}0`), answer("someone-else", "PUBLISH_FAILED"), answer(closure),
      answer(closure), answer(closure, "PUBLISH_FAILED"));
    assert.equal((await first).status, "PUBLISH_OK");
    const second = client.publish(SUBJECT, "y", { timeout: 0.2 });
    const late = (await conn.expect("publish")).closure;
    await assert.rejects(second, (e) => e instanceof PublishOutcomeUnknown && e.closure === late);
    conn.send(answer(late), answer(late), answer(null, "PUBLISH_FAILED")); // a publishNoWait's
    client.subscribe("/z/z"); // its answer comes after every status above
    await conn.expect("subscribe");
    conn.send(status("SUBSCRIBE_ALLOW", "/z/z", 1, 0));
    await until(() => notes.some((n) => n.status === "SUBSCRIBE_ALLOW"));
    const told = notes.filter((n) => n.status.startsWith("PUBLISH")).map((n) => [n.status, n.closure]);
    assert.deepEqual(told, [["PUBLISH_OK", late], ["PUBLISH_FAILED", null]]); // was: 6 more
    assert.equal(client.router.strayPublishStatuses, 5);
  } finally {
    await client.close();
    server.close();
  }
});

const UNNAMED_CODES = { 1012: true, 3000: true, 4321: false, 4999: true }; // code: reconnect

for (const [code, reconnect] of Object.entries(UNNAMED_CODES).map(([c, r]) => [Number(c), r])) {
  test(`a close code the table does not name (${code}) follows the documented rule`, GUARD, async () => {
    const server = await FakeServer.start();
    const { client, notes } = open([server.url]);
    try {
      const { subscription, conn } = await subscribedAt(server, client);
      conn.write(closeFrame(code, "who knows"));
      if (reconnect) {
        await resumedFrom(server, 10, { snapshot: true });
        assert.equal(client.error, null);
      } else {
        await assert.rejects(subscription.next(), (e) => e.code === code && e.reason === "who knows");
      }
      const down = notes.find((n) => n.status === "SERVER_DOWN");
      assert.match(down.reason, new RegExp(`^closed with ${code}\\b.*: who knows$`));
    } finally {
      await client.close();
      server.close();
    }
  });
}

test("a DATA_SYNC before any recovered message moves nothing, or is told as a resync", GUARD, async () => {
  const server = await FakeServer.start();
  const { client, notes } = open([server.url]);
  try {
    const { subscription, conn } = await subscribedAt(server, client);
    conn.send(message(SUBJECT, 11));
    assert.deepEqual(await seqs(subscription, 1), ["/a/b update 11"]);
    conn.reset();
    const again = await resumedFrom(server, 11);
    again.send(
      status("DATA_SYNC", SUBJECT, 7, 13), // before the SUBSCRIBE_ALLOW: answers nothing yet
      status("SUBSCRIBE_ALLOW", SUBJECT),
      status("DATA_SYNC", SUBJECT, 7, 13), // 12 and 13 missed, nothing recovered
      message(SUBJECT, 14),
    );
    assert.deepEqual(await seqs(subscription, 1), ["/a/b update 14"]);
    const resync = notes.find((n) => n.status === "DATA_RESYNC");
    assert.deepEqual(resync.position, { epoch: 7, seq: 13 });
  } finally {
    await client.close();
    server.close();
  }
});

test("a snapshot or history outside a subscribe's answer is not delivered", GUARD, async () => {
  const server = await FakeServer.start();
  const { client } = open([server.url]);
  try {
    const subscription = client.subscribe(SUBJECT, { history: 2 });
    const conn = await server.nextConnection();
    await conn.acceptSession();
    await conn.expect("subscribe");
    const historical = (seq) => update(SUBJECT, seq, { type: "historical" });
    conn.send(
      status("SUBSCRIBE_ALLOW", SUBJECT, 7, 10),
      batch([historical(9), historical(10)]),
      batch([historical(10)]), // the history again
      batch([update(SUBJECT, 11), update(SUBJECT, 12)]),
      batch([update(SUBJECT, 5, { type: "snapshot" })]), // an old snapshot
      batch([historical(3), update(SUBJECT, 13)]),
    );
    assert.deepEqual(await seqs(subscription, 5), [ // was: 10, 5, 3 among them
      "/a/b historical 9", "/a/b historical 10", "/a/b update 11", "/a/b update 12",
      "/a/b update 13",
    ]);
  } finally {
    await client.close();
    server.close();
  }
});

test("statuses of a subject never subscribed tell the application nothing", GUARD, async () => {
  // attack test (holds before too): DATA_SYNC, DATA_RESYNC, SUBSCRIBE_ALLOW, SUBSCRIBE_DENY
  // of a stranger, at any position; the subscribed subject goes on, its statuses told
  const server = await FakeServer.start();
  const { client, notes } = open([server.url]);
  try {
    const { subscription, conn } = await subscribedAt(server, client);
    const strangers = [];
    for (const name of ["DATA_SYNC", "DATA_RESYNC", "SUBSCRIBE_ALLOW", "SUBSCRIBE_DENY"]) {
      strangers.push(status(name, "/x/y"), status(name, "/x/y", 3, 2 ** 40),
        status(name, "/x/y", 7, 1));
    }
    conn.send(...strangers, message(SUBJECT, 11), status("DATA_RESYNC", SUBJECT, 7, 11),
      message(SUBJECT, 12));
    assert.deepEqual(await seqs(subscription, 2), ["/a/b update 11", "/a/b update 12"]);
    await until(() => notes.some((n) => n.status === "DATA_RESYNC"));
    assert.deepEqual(notes.filter((n) => n.subject === "/x/y"), []);
    assert.deepEqual(notes.filter((n) => n.subject === SUBJECT).map((n) => n.status),
      ["SUBSCRIBE_ALLOW", "DATA_RESYNC"]);
    assert.equal(client.error, null);
  } finally {
    await client.close();
    server.close();
  }
});
