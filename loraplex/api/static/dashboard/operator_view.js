// The operator view: the cycle timeline, engine utilization, adapters resident and paged,
// queue waits per tenant, refused submits, and every tenant's usage (operator keys only).

import { download, getJSON } from "./api.js";
import { lineChart } from "./charts.js";
import { bytes, card, clock, el, fillRows, int, num, seconds, usd } from "./format.js";
import { CLASS_COLORS, Timeline } from "./timeline.js";

const LANE_COLORS = ["#4c7fd9", "#3fb27f", "#e0803a", "#c08ad8", "#d64545", "#7a8aa0"];

export class OperatorView {
  constructor(root) {
    this.root = root;
    this.timeline = new Timeline(root.querySelector("#timeline"), root.querySelector("#timeline-tip"));
    const windowSelect = root.querySelector("#timeline-window");
    windowSelect.addEventListener("change", () => {
      this.timeline.windowS = Number(windowSelect.value);
      this.timeline.draw();
    });
    root.querySelector("#trace-download").addEventListener("click",
      () => download("/api/v1/loraplex/trace", "loraplex-trace.json"));
    root.querySelector("#timeline-legend").replaceChildren(
      ...Object.entries(CLASS_COLORS).map(([cls, color]) => legendItem(color, cls)),
      legendItem("#f2a33a", "packed several tenants"));
    window.addEventListener("resize", () => this.timeline.draw());
  }

  // One refresh; `this.phases` keeps how long its parts took (ms, performance.now()).
  async refresh() {
    const t0 = performance.now();
    const [stats, op, cycles] = await Promise.all([
      getJSON("/api/v1/loraplex/stats", { recent: 0 }),
      getJSON("/api/v1/loraplex/dashboard/operator"),
      getJSON("/api/v1/loraplex/cycles", { after: this.timeline.cursors(), limit: 100000 }),
    ]);
    const t1 = performance.now();
    this.timeline.merge(cycles);
    const t2 = performance.now();
    this.timeline.draw();
    const t3 = performance.now();
    this.renderCards(stats);
    this.renderPacked();
    this.renderUtilization(stats);
    this.renderAdapters(stats);
    this.renderWaits(op);
    this.renderAdmissions(op);
    this.renderTenants(stats, op);
    const t4 = performance.now();
    this.phases = { requests_ms: t1 - t0, merge_ms: t2 - t1, timeline_draw_ms: t3 - t2,
      panels_ms: t4 - t3 };
  }

  renderCards(stats) {
    const u = stats.utilization;
    const memory = stats.workers.map((w) => w.memory);
    const sections = stats.schedulers.map((s) => s.cycles).filter((c) => c.count);
    const packed = sections.reduce((a, c) => a + c.multi_tenant_fraction * c.count, 0);
    const cycles = sections.reduce((a, c) => a + c.count, 0);
    this.root.querySelector("#cycles-count").textContent =
      `${int(this.timeline.count())} kept · ${int(packed)} packed several tenants`;
    this.root.querySelector("#op-cards").replaceChildren(
      card("Engine workers", int(stats.workers.length),
        [...new Set(stats.workers.flatMap((w) => w.models))].join(", ")),
      card("Utilization, 60 s", pct(u["60s"]), `10 s ${pct(u["10s"])} · 5 min ${pct(u["300s"])}`),
      card("Queued ops", int(stats.queued_ops), `${int(stats.pending_futures)} futures pending`),
      card("Adapters resident", int(sum(memory, "resident_adapters")),
        bytes(sum(memory, "bytes_resident"))),
      card("Adapters paged", int(sum(memory, "paged_adapters")),
        `${int(sum(memory, "page_outs"))} page-outs`),
      card("Multi-tenant cycles", pct(cycles ? packed / cycles : 0),
        `of ${int(cycles)} training cycles kept`),
    );
  }

  renderPacked() {
    const rows = this.timeline.packed().map((r) => el("tr", { dataset: { index: r.index } },
      el("td", {}, r.lane), el("td", { class: "num" }, int(r.index)), el("td", {}, r.kind),
      el("td", { class: "num" }, seconds(r.engine)), el("td", { class: "num" }, int(r.ops)),
      el("td", { class: "num" }, int(r.tokens)),
      el("td", { class: "tenants" }, r.tenants.join(", "),
        r.numTenants > r.tenants.length ? ` (+${r.numTenants - r.tenants.length})` : "")));
    fillRows(this.root.querySelector("#packed-table"), rows, "no cycle has packed several tenants yet");
  }

  renderUtilization(stats) {
    const series = stats.schedulers.map((s, i) => {
      const busy = s.utilization_series.busy;
      const step = s.utilization_series.bucket_s;
      return { label: `${s.models[0]}/${s.worker}`, color: LANE_COLORS[i % LANE_COLORS.length],
        x: busy.map((_, j) => -(busy.length - 1 - j) * step), y: busy };
    });
    lineChart(this.root.querySelector("#utilization-chart"), {
      title: "engine-busy fraction per 5 s (seconds ago)", series, yRange: [0, 1],
      yFormat: pct, xFormat: (v) => `${Math.round(v)} s`, height: 190 });
  }

  renderAdapters(stats) {
    const rows = stats.workers.map((w) => {
      const m = w.memory;
      const budget = m.budget_bytes == null ? "unbounded" : bytes(m.budget_bytes);
      return el("tr", {}, el("td", {}, `${w.models[0]}/${w.worker}`),
        el("td", { class: "num" }, int(m.resident_adapters)),
        el("td", { class: "num" }, int(m.paged_adapters)),
        el("td", {}, `${bytes(m.bytes_resident)} of ${budget}`,
          m.paged_adapters ? ` · host ${bytes(m.bytes_host)}, disk ${bytes(m.bytes_disk)}` : ""),
        el("td", { class: "num" }, `${int(m.page_outs)} / ${int(m.page_ins)}`));
    });
    fillRows(this.root.querySelector("#adapters-table"), rows, "no engine workers");
  }

  renderWaits(op) {
    const entries = Object.entries(op.queue_waits_s).flatMap(([tenant, byClass]) =>
      Object.entries(byClass).map(([cls, p]) => ({ tenant, cls, p })));
    const worst = entries.reduce((m, e) => Math.max(m, e.p.p95 || 0), 1e-9);
    const rows = entries.map(({ tenant, cls, p }) => el("tr", {},
      el("td", {}, el("code", {}, tenant)), el("td", {}, cls),
      el("td", { class: "num" }, int(p.n)), el("td", { class: "num" }, seconds(p.p50)),
      el("td", { class: "num" }, seconds(p.p95)), el("td", { class: "num" }, seconds(p.max)),
      el("td", {}, meter(p.p50 / worst, p.p95 / worst))));
    fillRows(this.root.querySelector("#waits-table"), rows, "no queue waits recorded yet");
  }

  renderAdmissions(op) {
    const events = [...op.admissions.events].reverse().slice(0, 50);
    const rows = events.map((e) => el("tr", {}, el("td", {}, clock(e.time)),
      el("td", {}, el("code", {}, e.tenant)), el("td", {}, e.kind), el("td", {}, e.reason)));
    const totals = Object.entries(op.admissions.rejected)
      .map(([t, kinds]) => `${t}: ${Object.entries(kinds).map(([k, n]) => `${n} ${k}`).join(", ")}`);
    fillRows(this.root.querySelector("#admissions-table"), rows,
      totals.length ? `refused since start: ${totals.join("; ")}` : "no submit refused (no backpressure)");
  }

  renderTenants(stats, op) {
    const priced = Object.fromEntries(op.usage.tenants.map((t) => [t.tenant, t.totals]));
    const names = [...new Set([...Object.keys(priced), ...Object.keys(stats.tenants)])].sort();
    const rows = names.map((name) => {
      const live = stats.tenants[name] || {};
      const u = priced[name];
      const queue = live.queue || {};
      return el("tr", { dataset: { tenant: name } }, el("td", {}, el("code", {}, name)),
        el("td", { class: "num" }, int(Object.values(live.ops || {}).reduce((a, b) => a + b, 0))),
        el("td", { class: "num" }, int((queue.train_waiting || 0) + (queue.sample_waiting || 0))),
        el("td", { class: "num" }, int(u ? u.tokens.trained_tokens : live.trained_tokens)),
        el("td", { class: "num" }, int(u ? u.tokens.sampled_tokens : live.sampled_tokens)),
        el("td", { class: "num" }, num(u ? u.engine_s.total : live.engine_s, 3)),
        el("td", { class: "num" }, u ? usd(u.bill_usd.per_rollout.total) : "–"),
        el("td", { class: "num" }, u ? usd(u.bill_usd.cache_aware.total) : "–"));
    });
    fillRows(this.root.querySelector("#tenant-usage-table"), rows, "no tenants yet");
    const sheet = op.usage.price_sheet;
    this.root.querySelector("#price-note").textContent =
      `Priced with ${sheet.name} (effective ${sheet.effective}, cached prefill at ${sheet.cached_prefill_ratio} × prefill).`;
  }
}

function pct(v) {
  return v == null ? "–" : `${(v * 100).toFixed(v < 0.1 ? 1 : 0)}%`;
}

function sum(items, key) {
  return items.reduce((a, m) => a + (m[key] || 0), 0);
}

function legendItem(color, label) {
  const swatch = el("i");
  swatch.style.background = color;
  return el("span", {}, swatch, label);
}

function meter(p50, p95) {
  const a = el("span", { class: "p95" });
  a.style.width = `${Math.min(100, p95 * 100)}%`;
  const b = el("span", { class: "p50" });
  b.style.width = `${Math.min(100, p50 * 100)}%`;
  return el("div", { class: "meter" }, a, b);
}
