// Compiled (never run) by `npm test`: the declarations in types/ describe the API as
// the README uses it; a wrong call below must fail the type check.
import {
  type Message, type Notification, PublishDeniedError, PublishOutcomeUnknown, connect,
} from "../types/migratory.js";

async function ticker(): Promise<void> {
  const client = connect(["100 ws://127.0.0.1:8800", "50 ws://127.0.0.1:8801"], {
    token: "t0k3n", reconnect: { initialDelay: 0.2, maxAttempts: null }, keepalive: { interval: 5 },
  });
  const stop: () => void = client.onNotification((n: Notification) => console.log(n.status, n.position?.seq));
  const subscription = client.subscribe("/Stocks/NYSE/IBM", { history: 10, conflationMs: 500 });
  for await (const message of subscription) {
    const m: Message = message;
    console.log(m.type, m.seq, m.text, m.fields.volume);
    break;
  }
  client.subscribe(["/a/b", "/a/c"], { onMessage: (m) => console.log(m.subject) });
  try {
    const { position } = await client.publish("/a/b", "193", { fields: { k: "v" }, retained: true });
    console.log(position.epoch, position.seq);
  } catch (error) {
    if (error instanceof PublishDeniedError) console.log(error.status, error.reason);
    if (error instanceof PublishOutcomeUnknown) console.log(error.closure);
  }
  // @ts-expect-error content must be text or bytes
  await client.publish("/a/b", 42);
  // @ts-expect-error no such option
  client.subscribe("/a/b", { histroy: 1 });
  stop();
  await client.close();
}
void ticker;
