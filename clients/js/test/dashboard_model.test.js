// The dashboard's model: meta-subject messages (docs/monitoring.md) in, rows and chart
// series out.

import assert from "node:assert/strict";
import { test } from "node:test";

import { CLUSTER_SUBJECT, ClusterView, statsSubject } from "../dashboard/model.js";

const cluster = (member, index, extra = {}) => JSON.stringify({
  format: 1, kind: "cluster", member, time: 1000,
  status: { member, index, server_name: `migratory-${index}`, role: index < 3 ? "seed" : "non-seed",
    ready: true, not_ready_reason: null, applied_clsn: 40 + index, raft_state: index === 1 ? "leader" : "follower",
    raft_leader: "127.0.0.1:21011", ...extra },
});
const stats = (member, time, inRate, extra = {}) => JSON.stringify({
  format: 1, kind: "stats", member, server: "s", time,
  counters: { connections_open: 4, slow_consumers: 1 },
  windows: { last_sample: { clients: 4, messages_in_per_second: inRate, messages_out_per_second: 2 * inRate,
    bytes_out_per_second: 100, latency_ms: 1.5, ...extra } },
});

test("stats subjects are named as the server names them", () => {
  assert.equal(statsSubject("127.0.0.1:21000"), "/migratory/stats/127.0.0.1:21000");
  assert.equal(statsSubject("a b/c"), "/migratory/stats/a_b_c");
  assert.equal(statsSubject(""), "/migratory/stats/_");
});

test("rows: one per member in index order, with role, Raft state and figures", () => {
  const view = new ClusterView({ staleAfter: 5 });
  for (let i = 9; i >= 0; i -= 1) {
    const member = `127.0.0.1:210${i}0`;
    assert.equal(view.onMessage(CLUSTER_SUBJECT, cluster(member, i), 2000), member);
    assert.equal(view.onMessage(statsSubject(member), stats(member, 1000, i), 2000), member);
  }
  const rows = view.rows(2002); // (ages from arrival, on this browser's clock)
  assert.equal(rows.length, 10);
  assert.deepEqual(rows.map((r) => r.index), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
  assert.deepEqual(
    { ...rows[1], age: undefined },
    { member: "127.0.0.1:21010", index: 1, server: "migratory-1", role: "seed", raft: "leader",
      ready: true, notReadyReason: null, connections: 4, messagesIn: 1, messagesOut: 2,
      bytesOut: 100, latencyMs: 1.5, slowConsumers: 1, appliedClsn: 41, age: undefined,
      statsCount: 1, silent: false },
  );
  assert.equal(rows[1].age, 2);
  assert.equal(view.leader(), "127.0.0.1:21010");
  assert.equal(view.rows(2006)[0].silent, true, "no message for longer than staleAfter");
  // an older (cached) message arriving later does not replace a newer one
  view.onMessage(statsSubject("127.0.0.1:21000"), stats("127.0.0.1:21000", 990, 77), 2000, null,
    "historical");
  assert.equal(view.rows(2002)[0].messagesIn, 0);
});

test("charts: aligned on whole seconds, null where a member had no sample", () => {
  const view = new ClusterView();
  view.onMessage(statsSubject("a"), stats("a", 10.2, 5), 0);
  view.onMessage(statsSubject("b"), stats("b", 11.4, 7), 0);
  view.onMessage(statsSubject("a"), stats("a", 12.1, 6), 0);
  assert.deepEqual(view.chart("messages_in_per_second"), {
    members: ["a", "b"], data: [[10, 11, 12], [5, null, 6], [null, 7, null]],
  });
});

test("history older than historySeconds is dropped", () => {
  const view = new ClusterView({ historySeconds: 60 });
  for (let t = 0; t <= 120; t += 10) view.onMessage(statsSubject("a"), stats("a", t, t), 0);
  assert.deepEqual(view.chart("messages_in_per_second").data[0], [60, 70, 80, 90, 100, 110, 120]);
});

test("what is not a meta-subject message the dashboard reads is ignored", () => {
  const view = new ClusterView();
  assert.equal(view.onMessage(CLUSTER_SUBJECT, "not json", 0), null);
  assert.equal(view.onMessage(CLUSTER_SUBJECT, "[1, 2]", 0), null);
  assert.equal(view.onMessage(CLUSTER_SUBJECT, JSON.stringify({ kind: "cluster" }), 0), null);
  assert.equal(view.onMessage("/migratory/other", JSON.stringify({ kind: "audit", member: "a" }), 0), null);
  assert.equal(view.leader(), null);
  view.onMessage(statsSubject("a"), stats("a", 1, 1, { latency_ms: null }), 0);
  assert.equal(view.rows(0)[0].latencyMs, null);
  assert.equal(view.rows(0)[0].raft, "");
});

test("each stats message's seq is kept beside its receive time: a hole is a push missed", () => {
  const view = new ClusterView({ staleAfter: 5 });
  for (const seq of [4, 5, 7]) view.onMessage(statsSubject("a"), stats("a", seq, seq), seq, seq);
  const entry = view.members.get("a");
  assert.deepEqual(entry.seqs, [4, 5, 7]);
  assert.deepEqual(entry.heard, [4, 5, 7]);
});

test("a member's clock off this browser's, or stepping back, changes nothing shown", () => {
  // before: age and silence compared the member's `time` with this browser's clock (a
  // member 2 minutes behind was silent for ever), and a message said earlier than the
  // last was dropped (a member whose clock stepped back an hour froze for the hour)
  const view = new ClusterView({ staleAfter: 6 });
  const behind = 5000 - 120; // the member's clock, 2 minutes behind this browser's
  for (let t = 0; t < 3; t += 1) {
    view.onMessage(statsSubject("a"), stats("a", behind + t, t), 5000 + t);
  }
  let [row] = view.rows(5003);
  assert.equal(row.silent, false);
  assert.equal(row.age, 1);
  view.onMessage(statsSubject("a"), stats("a", behind + 3 - 3600, 42), 5004); // stepped back
  view.onMessage(CLUSTER_SUBJECT, cluster("a", 0), 5004);
  [row] = view.rows(5005);
  assert.equal(row.messagesIn, 42, "the live message after the step is shown");
  assert.equal(row.silent, false);
  // what the cache holds (subscribe with history) is old news, and not a sign of life
  const fresh = new ClusterView({ staleAfter: 6 });
  fresh.onMessage(statsSubject("b"), stats("b", 9000, 7), 9001, null, "historical");
  [row] = fresh.rows(9001);
  assert.equal(row.messagesIn, 7);
  assert.equal(row.silent, true, "only cached messages of it so far");
});
