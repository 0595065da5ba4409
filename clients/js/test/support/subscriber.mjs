// A subscriber on node's WebSocket for the tests that run real servers: subscribes to
// one subject on the given servers ("WEIGHT URL" entries) and writes one JSON line per
// event on stdout -- {"note": status, "reason": ..., "server": ...} for a notification,
// {"message": content as text, "seq": ..., "type": ...} for a message -- until stdin
// closes. Run by tests/cluster/test_cluster_frozen_member_js.py.
//
//   node --experimental-websocket subscriber.mjs SUBJECT SERVER...

import { connect } from "../../src/index.js";

const [subject, ...servers] = process.argv.slice(2);
const reconnect = { initialDelay: 0.05, maxDelay: 0.2, connectTimeout: 3 };
const client = connect(servers, { WebSocket: globalThis.WebSocket, reconnect });
const line = (record) => process.stdout.write(`${JSON.stringify(record)}\n`);
client.onNotification((n) => line({ note: n.status, reason: n.reason ?? null, server: client.server }));
client.subscribe(subject, {
  onMessage: (m) => line({ message: m.text, seq: m.seq, type: m.type }),
});
process.stdin.on("data", () => {});
process.stdin.on("end", async () => {
  await client.close();
  process.exit(0);
});
