// migratory: the browser (ES module) client of the migratory pub/sub server.
//
//   import { connect } from "/client/migratory.js";
//   const client = connect(["100 ws://127.0.0.1:8800"]);
//   client.subscribe("/Stocks/NYSE/IBM", { onMessage: (m) => console.log(m.seq, m.text) });
//   const { position } = await client.publish("/Stocks/NYSE/IBM", "193");

export { Backoff, reconnectPolicy } from "./backoff.js";
export { CLOSE_CODES, CloseCode, describeCloseCode, shouldReconnect } from "./close_codes.js";
export {
  Message, MessageType, PROTOCOL_VERSION, Qos, SUBPROTOCOL, decodeServerOp, encodeClientOp,
  position,
} from "./codec.js";
export { Client, connect } from "./client.js";
export {
  ClientClosedError, ConnectionClosedError, MessageSizeLimitExceededError, MigratoryError,
  NotConnectedError, ProtocolError, PublishDeniedError, PublishError, PublishFailedError,
  PublishOutcomeUnknown, ServerUnavailableError,
} from "./errors.js";
export { SubjectTracker, Verdict } from "./resume.js";
export { DEFAULT_WEIGHT, chooseServer, parseServer, parseServers } from "./servers.js";
export { Subscription } from "./subscription.js";
