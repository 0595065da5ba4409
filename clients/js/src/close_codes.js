// The one table of WebSocket close codes shared by server and SDKs
// (migratory/protocol/close_codes.py; this client's copy is generated from it).
// Rule: reconnect after a code marked `reconnect` and after a connection lost without
// a close frame (1006); give up on the others, because retrying cannot help.
// Application codes 4000-4499 are terminal, 4500-4999 ask for a reconnect.

import { CLOSE_CODE_TABLE } from "./close_codes.generated.js";

/** @type {ReadonlyMap<number, {code: number, name: string, reconnect: boolean, meaning: string}>} */
export const CLOSE_CODES = new Map(CLOSE_CODE_TABLE.map((row) => [row.code, row]));

/** Close codes by name: `CloseCode.DRAINED === 4502`. */
export const CloseCode = Object.freeze(
  Object.fromEntries(CLOSE_CODE_TABLE.map((row) => [row.name, row.code])),
);

/** Whether a client should reconnect after a close with `code` (null: no code given). */
export function shouldReconnect(code) {
  if (code === null || code === undefined || code === 1005) return true; // 1005: no code
  const known = CLOSE_CODES.get(code);
  if (known !== undefined) return known.reconnect;
  if (code >= 4000 && code <= 4499) return false;
  return !(code === 1000 || (code >= 1002 && code <= 1010));
}

/** "4502 DRAINED" for a known code, else the number. */
export function describeCloseCode(code) {
  const known = CLOSE_CODES.get(code);
  return known === undefined ? String(code) : `${code} ${known.name}`;
}
