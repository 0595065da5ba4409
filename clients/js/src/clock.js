// The SDK's clock for timeouts and silences: monotonic (performance.now), never the
// wall clock. With Date.now a client whose wall clock stepped back an hour (an NTP
// correction, a laptop waking) stopped noticing a silent server for the hour -- the
// heartbeat's "nothing from the server" never came, no failover -- and one stepped
// forward timed out every publish waiting at once (test/heartbeat.test.js).

/** Milliseconds on a clock that only moves forward, at the rate of real time. */
export const monotonicMs = () => performance.now();
