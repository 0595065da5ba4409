// Types of the migratory browser client (clients/js/src, served as /client/migratory.js).

export type MessageType = "snapshot" | "update" | "recovered" | "historical";
export type QosName = "standard" | "guaranteed";
export type SubjectStatus = "DATA_SYNC" | "DATA_RESYNC" | "SUBSCRIBE_ALLOW" | "SUBSCRIBE_DENY";
export type PublishStatus =
  | "PUBLISH_OK" | "PUBLISH_FAILED" | "PUBLISH_DENIED" | "MESSAGE_SIZE_LIMIT_EXCEEDED";
export type NotificationStatus = "SERVER_UP" | "SERVER_DOWN" | SubjectStatus | PublishStatus;

/** A position `(epoch, seq)`: seq grows by one per message of a subject; the epoch names
 * the lineage of that sequence. */
export interface Position {
  readonly epoch: number;
  readonly seq: number;
}
export function position(epoch: number, seq: number): Position;

export const MessageType: {
  readonly SNAPSHOT: "snapshot";
  readonly UPDATE: "update";
  readonly RECOVERED: "recovered";
  readonly HISTORICAL: "historical";
};
export const Qos: { readonly STANDARD: "standard"; readonly GUARANTEED: "guaranteed" };
export const PROTOCOL_VERSION: 1;
export const SUBPROTOCOL: "migratory.cbor";

/** One delivered message (frozen). */
export class Message {
  constructor(init: {
    subject: string; content: Uint8Array; fields?: Record<string, string>; retained?: boolean;
    qos?: QosName; epoch: number; seq: number; type?: MessageType;
  });
  readonly subject: string;
  readonly content: Uint8Array;
  readonly fields: Readonly<Record<string, string>>;
  readonly retained: boolean;
  readonly qos: QosName;
  readonly epoch: number;
  readonly seq: number;
  readonly type: MessageType;
  /** `content` decoded as UTF-8. */
  readonly text: string;
  readonly position: Position;
}

/** One client notification; `subject` and `position` are null for server events. */
export interface Notification {
  readonly status: NotificationStatus;
  readonly subject: string | null;
  readonly position: Position | null;
  readonly reason: string | null;
  /** URL of the server it came from. */
  readonly server: string | null;
  /** Set on the status of a publish whose `publish()` timed out (the closure of its
   * PublishOutcomeUnknown): its outcome after all. */
  readonly closure: string | null;
}

export interface PublishResult {
  readonly status: "PUBLISH_OK";
  readonly subject: string;
  readonly position: Position;
}

export interface ReconnectOptions {
  /** Seconds before the first retry (default 0.5). */
  initialDelay?: number;
  /** Upper bound of a retry delay in seconds (default 30). */
  maxDelay?: number;
  /** Growth of the delay per consecutive failure (default 2). */
  multiplier?: number;
  /** A delay is shortened by a random fraction up to this (0..1, default 0.5). */
  jitter?: number;
  /** Consecutive failed attempts before ServerUnavailableError; null (default) = never. */
  maxAttempts?: number | null;
  /** Seconds for the WebSocket handshake plus connect/connected (default 10). */
  connectTimeout?: number;
  /** Seconds a session stays up after `connected` for its end to reset the back-off
   * (default 5); a session that ends sooner is a failed attempt (backed off, counted
   * towards maxAttempts). */
  healthyAfter?: number;
}
export type ReconnectPolicy = Readonly<Required<ReconnectOptions>>;
export function reconnectPolicy(options?: ReconnectOptions): ReconnectPolicy;

export interface ConnectOptions {
  /** Entitlement token sent with `connect`. */
  token?: string | null;
  /** Asked for the token of every new session instead of `token` (a session closed
   * 4503 TOKEN_EXPIRED reconnects with a fresh one). */
  tokenProvider?: (() => string | null | Promise<string | null>) | null;
  /** A name for the server's logs. */
  name?: string;
  reconnect?: ReconnectOptions;
  /** A protocol ping every `interval` s; no pong within `timeout` s = connection lost.
   * `heartbeat` (default 2, null: none): asked of the server in `connect`; once granted,
   * nothing from it for twice the interval granted = connection lost, no round trip. */
  keepalive?: { interval?: number; timeout?: number; heartbeat?: number | null };
  /** Messages buffered per iterated subscription before it pauses (default 10000). */
  messageBuffer?: number;
  /** Notifications kept for `notifications()` (default 10000; the oldest are dropped). */
  notificationBuffer?: number;
  /** Random source in [0, 1) for server choice and jitter (default Math.random). */
  random?: () => number;
  /** WebSocket constructor (default globalThis.WebSocket; in node < 22 e.g. `ws`). */
  WebSocket?: unknown;
}

export interface SubscribeOptions {
  /** The last N cached messages first (type historical) instead of the snapshot. */
  history?: number;
  /** >= 100: one merged message per subject per period (rounded down to 100 ms). */
  conflationMs?: number;
  /** Called for each message; without it, iterate the subscription. */
  onMessage?: (message: Message) => void;
}

/** Messages of some subjects, in order per subject, without duplicates or gaps. */
export class Subscription implements AsyncIterableIterator<Message> {
  readonly subjects: readonly string[];
  readonly active: boolean;
  next(): Promise<IteratorResult<Message, undefined>>;
  return(): Promise<IteratorResult<Message, undefined>>;
  [Symbol.asyncIterator](): Subscription;
  /** Stop the subjects' messages; buffered messages are discarded. Idempotent. */
  unsubscribe(): Promise<void>;
}

export interface PublishOptions {
  fields?: Record<string, string>;
  retained?: boolean;
  qos?: QosName;
  /** Seconds to wait for a session and then for the status (default 10). */
  timeout?: number;
}

export class Client {
  constructor(servers: string | readonly string[], options?: ConnectOptions);
  /** URL of the server of the open session, or null. */
  readonly server: string | null;
  /** Why the client ended, if it ended by itself. */
  readonly error: MigratoryError | null;
  onNotification(listener: (notification: Notification) => void): () => void;
  notifications(): AsyncIterableIterator<Notification> & { readonly dropped: number };
  waitConnected(): Promise<string>;
  subscribe(subjects: string | readonly string[], options?: SubscribeOptions): Subscription;
  /** Resolves on PUBLISH_OK; rejects with PublishError (definite), NotConnectedError (not
   * sent), PublishOutcomeUnknown (sent, no status) or ClientClosedError. */
  publish(subject: string, content: string | Uint8Array | ArrayBuffer,
    options?: PublishOptions): Promise<PublishResult>;
  /** No closure, no PUBLISH_OK: failures arrive as notifications. */
  publishNoWait(subject: string, content: string | Uint8Array | ArrayBuffer,
    options?: PublishOptions): Promise<void>;
  close(): Promise<void>;
}

/** Open a client; sessions open in the background (watch SERVER_UP).
 * `servers`: "WEIGHT URL" or "URL" (weight 100) entries. */
export function connect(servers: string | readonly string[], options?: ConnectOptions): Client;

export interface CloseCodeInfo {
  readonly code: number;
  readonly name: string;
  readonly reconnect: boolean;
  readonly meaning: string;
}
export const CLOSE_CODES: ReadonlyMap<number, CloseCodeInfo>;
export const CloseCode: Readonly<Record<string, number>>;
export function shouldReconnect(code: number | null | undefined): boolean;
export function describeCloseCode(code: number): string;

export class MigratoryError extends Error {}
export class ConnectionClosedError extends MigratoryError {
  readonly code: number;
  readonly reason: string | null;
  readonly server: string;
}
export class ServerUnavailableError extends MigratoryError {
  readonly attempts: number;
  readonly lastReason: string;
}
export class ClientClosedError extends MigratoryError {}
export class NotConnectedError extends MigratoryError {
  readonly subject: string;
  readonly timeout: number;
  /** Why it was not sent: no session, or one whose WebSocket took nothing more. */
  readonly reason: string;
}
export class PublishOutcomeUnknown extends MigratoryError {
  readonly subject: string;
  readonly closure: string;
  readonly reason: string;
}
export class PublishError extends MigratoryError {
  readonly status: Exclude<PublishStatus, "PUBLISH_OK">;
  readonly subject: string;
  readonly reason: string | null;
}
export class PublishFailedError extends PublishError {}
export class PublishDeniedError extends PublishError {}
export class MessageSizeLimitExceededError extends PublishError {}
export class ProtocolError extends MigratoryError {
  readonly closeCode: number;
  readonly reason: string;
}

// --- the pure parts, for tools and tests ---
export interface ServerEntry { readonly url: string; readonly weight: number }
export const DEFAULT_WEIGHT: 100;
export function parseServer(entry: string): ServerEntry;
export function parseServers(entries: string | readonly string[]): readonly ServerEntry[];
export function chooseServer(servers: readonly ServerEntry[], random: () => number,
  avoid?: ServerEntry | null): ServerEntry;
export class Backoff {
  constructor(policy: ReconnectPolicy, random: () => number);
  readonly failures: number;
  nextDelay(): number;
  reset(): void;
  exhausted(): boolean;
}
export const Verdict: { readonly DELIVER: "deliver"; readonly DUPLICATE: "duplicate"; readonly GAP: "gap" };
export interface SubscriptionRequest {
  readonly subject: string;
  readonly position: Position | null;
  readonly history: number;
  readonly conflationMs: number;
  /** On a resume: the snapshot as of `position` is asked for too (the first
   * subscribe's answer was cut after its SUBSCRIBE_ALLOW, before its snapshot). */
  readonly snapshot?: boolean;
}
export class SubjectTracker {
  constructor(subject: string, options?: { history?: number; conflationMs?: number; position?: Position | null });
  readonly subject: string;
  readonly position: Position | null;
  readonly denied: boolean;
  readonly conflated: boolean;
  request(): SubscriptionRequest;
  sent(sessionId: number): void;
  skip(): void;
  onStatus(status: SubjectStatus, position: Position | null, sessionId?: number): void;
  onMessage(message: Message): "deliver" | "duplicate" | "gap";
  onSessionLost(): void;
}
export type ClientOp =
  | { op: "connect"; client?: string; token?: string | null; version?: number }
  | { op: "subscribe"; subscriptions: ReadonlyArray<Partial<SubscriptionRequest> & { subject: string }> }
  | { op: "unsubscribe"; subjects: readonly string[] }
  | { op: "publish"; subject: string; content: Uint8Array; fields?: Record<string, string>;
      retained?: boolean; qos?: QosName; closure?: string | null }
  | { op: "ping"; id?: number | null };
export type ServerOp =
  | { readonly op: "connected"; readonly server: string; readonly version: number;
      readonly maxSubjectsPerSubscribe: number | null }
  | { readonly op: "deliver"; readonly messages: readonly Message[] }
  | { readonly op: "status"; readonly status: SubjectStatus; readonly subject: string;
      readonly position: Position | null; readonly reason: string | null }
  | { readonly op: "publish_status"; readonly status: PublishStatus; readonly subject: string;
      readonly closure: string | null; readonly position: Position | null; readonly reason: string | null }
  | { readonly op: "pong"; readonly id: number | null }
  /** an op of no protocol version this client speaks: the session ignores it */
  | { readonly op: "unknown"; readonly name: string };
export function encodeClientOp(op: ClientOp): Uint8Array;
export function decodeServerOp(payload: Uint8Array | ArrayBuffer): ServerOp;
