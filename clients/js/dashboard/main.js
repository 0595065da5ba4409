// The live dashboard (served at /dashboard on the monitoring listener): subscribes with
// the JavaScript client to the meta-subjects and shows every member's role, Raft state,
// readiness and figures, with charts of the last minutes (uPlot).

import uPlot from "uplot";

import { connect } from "../src/index.js";
import { CLUSTER_SUBJECT, ClusterView, INDICATORS, statsSubject } from "./model.js";

const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
  "#ff9da7", "#9c755f", "#bab0ac", "#1f77b4", "#d62728"];
const $ = (id) => document.getElementById(id);
const now = () => Date.now() / 1000;
const HISTORY = 120; // cached messages asked for per subject on subscribe

const config = await (await fetch("/dashboard/config.json", { cache: "no-store" })).json();
const view = new ClusterView({ staleAfter: Math.max(3 * config.push_interval, 6) });
const state = { renders: 0, messages: 0, connection: "connecting", denied: null, view };
window.dashboard = state;

const client = connect(config.servers, { token: config.token, name: "dashboard" });
state.client = client;
const watched = new Set();

function onMeta(message) {
  state.messages += 1;
  const member = view.onMessage(message.subject, message.text, now(), message.seq, message.type);
  if (member !== null) watch(member);
}

function watch(member) {
  const subject = statsSubject(member);
  if (watched.has(subject)) return;
  watched.add(subject);
  client.subscribe(subject, { history: HISTORY, onMessage: onMeta });
}

client.onNotification((n) => {
  if (n.status === "SERVER_UP") state.connection = `connected to ${n.server}`;
  else if (n.status === "SERVER_DOWN") state.connection = `reconnecting: ${n.reason}`;
  else if (n.status === "SUBSCRIBE_DENY") state.denied = `${n.subject}: ${n.reason}`;
});
// the cached messages first: every member's latest view and the charts' recent past
client.subscribe(CLUSTER_SUBJECT, { history: 3 * HISTORY, onMessage: onMeta });
if (config.member) watch(config.member);

// --- rendering ------------------------------------------------------------------------

const fmt = (v, digits = 0) => (v === null || v === undefined ? "–"
  : v.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits }));
const COLUMNS = [
  ["member", (r) => r.member], ["server", (r) => r.server], ["role", (r) => r.role],
  ["raft", (r) => r.raft || "–"],
  ["ready", (r) => (r.ready === null ? "–" : r.ready ? "ready" : `no: ${r.notReadyReason ?? ""}`)],
  ["connections", (r) => fmt(r.connections)], ["msgs in/s", (r) => fmt(r.messagesIn, 1)],
  ["msgs out/s", (r) => fmt(r.messagesOut, 1)], ["bytes out/s", (r) => fmt(r.bytesOut)],
  ["latency ms", (r) => fmt(r.latencyMs, 2)], ["slow consumers", (r) => fmt(r.slowConsumers)],
  ["applied clsn", (r) => fmt(r.appliedClsn)], ["updated", (r) => (r.age === null ? "–" : `${fmt(r.age)} s ago`)],
];

function renderTable(rows) {
  const head = $("members").tHead.rows[0];
  if (!head.cells.length) for (const [name] of COLUMNS) head.insertCell().outerHTML = `<th>${name}</th>`;
  const body = $("members").tBodies[0];
  while (body.rows.length > rows.length) body.deleteRow(-1);
  rows.forEach((row, i) => {
    const tr = body.rows[i] ?? body.insertRow();
    tr.dataset.member = row.member;
    tr.className = [row.silent ? "silent" : "", row.raft === "leader" ? "leader" : "",
      row.ready === false ? "not-ready" : ""].join(" ").trim();
    COLUMNS.forEach(([name, cell], j) => {
      const td = tr.cells[j] ?? tr.insertCell();
      td.dataset.column = name;
      td.textContent = cell(row);
    });
  });
}

const charts = new Map();

function renderCharts() {
  for (const { key, label } of INDICATORS) {
    const { members, data } = view.chart(key);
    let chart = charts.get(key);
    if (chart && chart.members.join() !== members.join()) {
      chart.plot.destroy();
      chart = undefined;
    }
    if (!chart) {
      const box = $(`chart-${key}`);
      const options = {
        title: label, width: box.clientWidth || 600, height: 220,
        series: [{}, ...members.map((m, i) => ({
          label: m, stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: true,
          points: { show: false },
        }))],
        axes: [{}, { size: 60 }],
        scales: { x: { time: true } },
        legend: { live: false },
      };
      chart = { members, plot: new uPlot(options, data, box) };
      charts.set(key, chart);
    } else {
      chart.plot.setData(data);
    }
  }
}

function render() {
  const rows = view.rows(now());
  $("connection").textContent = state.connection;
  $("leader").textContent = view.leader() ?? "–";
  $("count").textContent = String(rows.length);
  $("notice").textContent = state.denied
    ? `subscription refused (${state.denied}): the monitoring token is missing or wrong`
    : config.push_interval > 2 ? `MonitorPushInterval is ${config.push_interval} s: figures move that often` : "";
  renderTable(rows);
  renderCharts();
  state.renders += 1;
}

render();
setInterval(render, 1000);
