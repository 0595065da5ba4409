import assert from "node:assert/strict";
import { test } from "node:test";

import { chooseServer, parseServer, parseServers } from "../src/index.js";
import { seeded } from "./support/random.js";

test("server entries: 'URL' or 'WEIGHT URL'", () => {
  assert.deepEqual(parseServer("ws://a:8800"), { url: "ws://a:8800", weight: 100 });
  assert.deepEqual(parseServer(" 50   wss://b/x "), { url: "wss://b/x", weight: 50 });
  assert.deepEqual(parseServer("0 ws://c:1"), { url: "ws://c:1", weight: 0 });
});

test("bad server entries are refused, naming the entry", () => {
  for (const [entry, why] of [
    ["", /expected 'URL' or 'WEIGHT URL'/],
    ["1 2 ws://a", /expected 'URL' or 'WEIGHT URL'/],
    ["-5 ws://a", /weight must be a non-negative integer/],
    ["x ws://a", /weight must be a non-negative integer/],
    ["http://a", /scheme must be ws:\/\/ or wss:\/\//],
    ["ws://", /bad URL|no host/],
    ["ws://a:99999", /bad URL/],
    ["ws://a:1/#x", /no #fragment/], // before: kept, and every attempt threw "Got fragment"
    ["ws://a#", /no #fragment/],
  ]) {
    assert.throws(() => parseServer(entry), (e) => e instanceof TypeError
      && e.message.includes(JSON.stringify(entry)) && why.test(e.message), entry);
  }
  assert.throws(() => parseServers([]), /empty/);
  assert.throws(() => parseServers(["ws://a", "5 ws://a"]), /listed twice/);
  assert.equal(parseServers("ws://a").length, 1);
});

test("one server spelled twice is refused (before: both kept, its share doubled)", () => {
  for (const [first, second] of [["ws://a:8800", "ws://a:8800/"], ["ws://A:1", "ws://a:1"],
    ["ws://a", "ws://a:80"], ["wss://a", "wss://a:443/"]]) {
    assert.throws(() => parseServers([first, `50 ${second}`]),
      new RegExp(`'50 ${second}': URL listed twice \\('${first}'\\)`), second);
  }
  assert.equal(parseServers(["ws://a:1", "ws://a:2", "ws://a:1/x", "wss://a:1"]).length, 4);
});

test("weighted choice follows the weights", () => {
  const servers = parseServers(["100 ws://a", "50 ws://b", "0 ws://c"]);
  const random = seeded(7);
  const counts = { "ws://a": 0, "ws://b": 0, "ws://c": 0 };
  for (let i = 0; i < 30000; i += 1) counts[chooseServer(servers, random).url] += 1;
  assert.equal(counts["ws://c"], 0);
  assert.ok(Math.abs(counts["ws://a"] / 30000 - 2 / 3) < 0.02, JSON.stringify(counts));
});

test("after a failure another server is preferred; weight 0 only when nothing else", () => {
  const servers = parseServers(["100 ws://a", "1 ws://b", "0 ws://c"]);
  const random = seeded(1);
  for (let i = 0; i < 200; i += 1) assert.equal(chooseServer(servers, random, servers[0]).url, "ws://b");
  const zeros = parseServers(["0 ws://x", "0 ws://y"]);
  const seen = new Set();
  for (let i = 0; i < 100; i += 1) seen.add(chooseServer(zeros, random).url);
  assert.deepEqual([...seen].sort(), ["ws://x", "ws://y"]);
  const single = parseServers(["ws://only"]);
  assert.equal(chooseServer(single, random, single[0]).url, "ws://only");
});
