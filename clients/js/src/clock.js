// The SDK's clock for timeouts and silences: monotonic (performance.now), never the
// wall clock. With Date.now a client whose wall clock stepped back an hour (an NTP
// correction, a laptop waking) stopped noticing a silent server for the hour -- the
// heartbeat's "nothing from the server" never came, no failover -- and one stepped
// forward timed out every publish waiting at once (test/heartbeat.test.js).

/** Milliseconds on a clock that only moves forward, at the rate of real time. */
export const monotonicMs = () => performance.now();

/** The longest delay a timer takes: setTimeout runs a longer one (over 2^31 - 1 ms,
 * 24.8 days) after 1 ms, in browsers as in node. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** `seconds` as a setTimeout delay: at most MAX_TIMER_MS, so a longer wait (a back-off,
 * a timeout, a keepalive given in months) ends after 24.8 days instead of at once. */
export const timerMs = (seconds) => Math.min(Math.max(0, seconds * 1000), MAX_TIMER_MS);
