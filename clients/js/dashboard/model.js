// What the dashboard knows about the cluster, built from the meta-subjects' messages
// (docs/monitoring.md): /migratory/cluster (each member publishes its own view there)
// and /migratory/stats/<member> (its counters and statistics windows). Pure: JSON in,
// rows and chart series out; the clock is passed in.

export const CLUSTER_SUBJECT = "/migratory/cluster";
const UNSAFE = /[^A-Za-z0-9._:@-]/g;

/** The stats subject of `member`, as the server names it (meta_subjects.stats_subject). */
export function statsSubject(member) {
  return `/migratory/stats/${member.replace(UNSAFE, "_") || "_"}`;
}

/** The indicators charted, from each stats message's `windows.last_sample`. */
export const INDICATORS = Object.freeze([
  { key: "messages_in_per_second", label: "messages in / s" },
  { key: "messages_out_per_second", label: "messages out / s" },
  { key: "latency_ms", label: "publish → fan-out latency (ms)" },
  { key: "clients", label: "connections" },
]);

const number = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);

export class ClusterView {
  /** `historySeconds`: how far back the charts reach; `staleAfter`: seconds without a
   * message after which a member is shown as silent. */
  constructor({ historySeconds = 300, staleAfter = 10 } = {}) {
    this.historySeconds = historySeconds;
    this.staleAfter = staleAfter;
    /** member -> {member, cluster, stats, clusterAt, statsAt} */
    this.members = new Map();
    /** indicator -> member -> [[secondsSinceEpoch, value], ...] */
    this.history = new Map(INDICATORS.map((i) => [i.key, new Map()]));
  }

  member(name) {
    let entry = this.members.get(name);
    if (entry === undefined) {
      entry = {
        member: name, cluster: null, stats: null, clusterAt: null, statsAt: null, statsCount: 0,
        clusterLive: false, statsLive: false, // the shown one came live, not from the cache
        heardAt: null, // when its last live message arrived here (receive time)
        heard: [], // when its last stats messages arrived here (receive time), newest last
        seqs: [], // the seq of each of those (its subject's): a hole is a push missed
      };
      this.members.set(name, entry);
    }
    return entry;
  }

  /** One message of /migratory/cluster or /migratory/stats/<member> (its JSON text,
   * seq and type), received at `now` (seconds since the epoch, this browser's clock);
   * returns the member it was about, or null when it is not one the dashboard reads.
   *
   * Which message is newer and when a member was last heard go by the order and time of
   * arrival, not by the member's `time` (its wall clock): compared with this browser's
   * clock, a member 2 minutes behind it was shown silent for ever, and one whose clock
   * stepped back an hour had every message dropped as older than the last for the hour.
   * Only a cached (historical, snapshot) message is old news once a live one came; its
   * `time` still orders the charts. */
  onMessage(subject, text, now, seq = null, type = "update") {
    let body;
    try {
      body = JSON.parse(text);
    } catch {
      return null;
    }
    if (body === null || typeof body !== "object" || typeof body.member !== "string") return null;
    const said = number(body.time) ?? now; // when the member said it (its wall clock)
    const live = type !== "historical" && type !== "snapshot";
    if (subject === CLUSTER_SUBJECT && body.kind === "cluster") {
      const entry = this.member(body.member);
      if (!live && (entry.clusterLive || (entry.clusterAt !== null && said < entry.clusterAt))) {
        return body.member; // a cached message is old news
      }
      entry.cluster = body.status ?? {};
      entry.clusterAt = said;
      entry.clusterLive = live;
      if (live) entry.heardAt = now;
    } else if (subject.startsWith("/migratory/stats/") && body.kind === "stats") {
      const entry = this.member(body.member);
      if (!live && (entry.statsLive || (entry.statsAt !== null && said < entry.statsAt))) {
        return body.member;
      }
      entry.stats = body;
      entry.statsAt = said;
      entry.statsLive = live;
      if (live) entry.heardAt = now;
      entry.statsCount += 1;
      entry.heard.push(now);
      entry.seqs.push(seq);
      if (entry.heard.length > 60) {
        entry.heard.shift();
        entry.seqs.shift();
      }
      this.record(body.member, said, body.windows?.last_sample ?? {});
    } else {
      return null;
    }
    return body.member;
  }

  record(member, time, sample) {
    const cutoff = time - this.historySeconds;
    for (const { key } of INDICATORS) {
      const series = this.history.get(key);
      const points = series.get(member) ?? [];
      points.push([Math.round(time), number(sample[key])]);
      while (points.length && points[0][0] < cutoff) points.shift();
      series.set(member, points);
    }
  }

  /** The Raft leader as the members see it (the one a leader reports of itself first). */
  leader() {
    for (const entry of this.members.values()) {
      if (entry.cluster?.raft_state === "leader") return entry.member;
    }
    for (const entry of this.members.values()) {
      const leader = entry.cluster?.raft_leader;
      if (typeof leader === "string" && leader) return leader;
    }
    return null;
  }

  /** One row per member, in member order (index, then name). */
  rows(now) {
    const rows = [...this.members.values()].map((entry) => {
      const cluster = entry.cluster ?? {};
      const counters = entry.stats?.counters ?? {};
      const sample = entry.stats?.windows?.last_sample ?? {};
      const heard = entry.heardAt ?? -Infinity; // (only cached messages yet: silent)
      return {
        member: entry.member,
        index: number(cluster.index),
        server: cluster.server_name ?? entry.stats?.server ?? "",
        role: cluster.role ?? "",
        raft: cluster.raft_state ?? "",
        ready: cluster.ready === undefined ? null : Boolean(cluster.ready),
        notReadyReason: cluster.not_ready_reason ?? null,
        connections: number(counters.connections_open) ?? number(sample.clients),
        messagesIn: number(sample.messages_in_per_second),
        messagesOut: number(sample.messages_out_per_second),
        bytesOut: number(sample.bytes_out_per_second),
        latencyMs: number(sample.latency_ms),
        slowConsumers: number(counters.slow_consumers),
        appliedClsn: number(cluster.applied_clsn),
        age: Number.isFinite(heard) ? now - heard : null,
        statsCount: entry.statsCount,
        silent: !Number.isFinite(heard) || now - heard > this.staleAfter,
      };
    });
    return rows.sort((a, b) => (a.index ?? 1e9) - (b.index ?? 1e9) || a.member.localeCompare(b.member));
  }

  /** uPlot data for one indicator: [times, member1 values, ...] aligned on whole
   * seconds (null where a member had no sample), and the member names. */
  chart(key) {
    const series = this.history.get(key);
    const members = [...series.keys()].sort();
    const times = [...new Set(members.flatMap((m) => series.get(m).map(([t]) => t)))].sort((a, b) => a - b);
    const at = new Map(times.map((t, i) => [t, i]));
    const data = [times];
    for (const member of members) {
      const values = new Array(times.length).fill(null);
      for (const [t, v] of series.get(member)) values[at.get(t)] = v;
      data.push(values);
    }
    return { members, data };
  }
}
