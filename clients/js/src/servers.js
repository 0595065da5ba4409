// The server list: "WEIGHT URL" entries and the weighted random choice among them.
// Pure: no I/O; the random source (a function returning [0, 1)) is injected.

export const DEFAULT_WEIGHT = 100;

/** Parse "ws://host:port" or "WEIGHT ws://host:port"; the error names the entry. */
export function parseServer(entry) {
  const parts = typeof entry === "string" ? entry.trim().split(/\s+/) : null;
  if (!parts || !parts[0] || parts.length > 2) {
    throw new TypeError(`server entry ${JSON.stringify(entry)}: expected 'URL' or 'WEIGHT URL'`);
  }
  let weight = DEFAULT_WEIGHT;
  let url = parts[0];
  if (parts.length === 2) {
    if (!/^\d+$/.test(parts[0])) {
      throw new TypeError(`server entry ${JSON.stringify(entry)}: weight must be a non-negative integer`);
    }
    weight = Number(parts[0]);
    url = parts[1];
  }
  let parsed;
  try {
    parsed = new URL(url);
  } catch {
    throw new TypeError(`server entry ${JSON.stringify(entry)}: bad URL`);
  }
  if (parsed.protocol !== "ws:" && parsed.protocol !== "wss:") {
    throw new TypeError(`server entry ${JSON.stringify(entry)}: URL scheme must be ws:// or wss://`);
  }
  if (!parsed.hostname) {
    throw new TypeError(`server entry ${JSON.stringify(entry)}: URL has no host`);
  }
  if (url.includes("#")) { // new WebSocket() throws at it: every attempt would fail
    throw new TypeError(`server entry ${JSON.stringify(entry)}: a WebSocket URL has no #fragment`);
  }
  return Object.freeze({ url, weight });
}

/** Parse a server list (a single string counts as one entry); a server listed twice,
 * however spelled ("ws://a" and "ws://A:80/": its share would double), is refused. */
export function parseServers(entries) {
  const list = typeof entries === "string" ? [entries] : [...entries];
  const servers = list.map(parseServer);
  if (!servers.length) throw new TypeError("the server list is empty");
  const seen = new Map();
  for (const server of servers) {
    const same = new URL(server.url).href; // host lower-cased, default port and "/" filled in
    if (seen.has(same)) {
      throw new TypeError(`server entry '${server.weight} ${server.url}': URL listed twice `
        + `('${seen.get(same)}')`);
    }
    seen.set(same, server.url);
  }
  return Object.freeze(servers);
}

/** Weighted random choice, preferring any server other than `avoid` (the one that failed).
 * Servers of weight 0 are chosen only when every candidate has weight 0. */
export function chooseServer(servers, random, avoid = null) {
  if (!servers.length) throw new TypeError("the server list is empty");
  const others = servers.filter((s) => s !== avoid);
  const candidates = others.length ? others : [...servers];
  const total = candidates.reduce((sum, s) => sum + s.weight, 0);
  if (total === 0) return candidates[Math.floor(random() * candidates.length)];
  let point = random() * total;
  for (const server of candidates) {
    point -= server.weight;
    if (point < 0 && server.weight > 0) return server;
  }
  return candidates.findLast((s) => s.weight > 0);
}
