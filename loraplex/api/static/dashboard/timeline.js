// The cycle timeline on a <canvas>: one row per lane (engine worker), each kept cycle record a
// bar at its wall-clock start, as wide as its engine (or IO) time and at least a pixel, as tall
// as the square root of its tokens, coloured by class; a cycle that packed several tenants gets
// an amber cap. Canvas because 10,000 bars are 10,000 fillRect calls (a few ms), not 10,000
// DOM nodes. Hovering a bar shows its record.

import { clock, int, seconds } from "./format.js";

export const CLASS_COLORS = {
  training: "#4c7fd9", sampling: "#3fb27f", control: "#9aa5b4", io: "#c08ad8",
};
const PACKED = "#f2a33a";
const AXIS_H = 20;

export class Timeline {
  constructor(canvas, tip) {
    this.canvas = canvas;
    this.tip = tip;
    this.lanes = [];        // [{lane, records: [{index, kind, cls, start, dur, ...}]}]
    this.tenants = [];
    this.windowS = 0;
    this.layout = null;
    canvas.addEventListener("mousemove", (e) => this.hover(e));
    canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  }

  // Merge one /cycles answer (new records of each lane after our cursors) and redraw.
  merge(answer) {
    this.tenants = answer.tenants;
    for (const lane of answer.lanes) {
      let mine = this.lanes.find((l) => l.lane === lane.lane);
      if (!mine) {
        mine = { lane: lane.lane, worker: lane.worker, records: [], capacity: lane.capacity };
        this.lanes.push(mine);
      }
      const c = lane.cycles;  // columns; times in integer µs (starts after c.t0, in s)
      const us = 1e-6;
      for (let i = 0; i < c.index.length; i += 1) {
        const engine = c.engine_us[i] * us;
        const io = c.io_us[i] * us;
        mine.records.push({
          index: c.index[i], kind: c.kind[i], cls: answer.classes[c.kind[i]] || "control",
          start: c.t0 + c.start_us[i] * us, dur: Math.max(engine, io), engine,
          train: c.train_us[i] * us, optim: c.optim_us[i] * us, io, tokens: c.num_tokens[i],
          ops: c.num_ops[i], models: c.num_models[i], numTenants: c.num_tenants[i],
          tenants: c.tenants[i].map((t) => answer.tenants[t]), wait: c.max_wait_us[i] * us,
        });
      }
      if (mine.records.length > mine.capacity) mine.records.splice(0, mine.records.length - mine.capacity);
      if (c.index.length) mine.records.sort((a, b) => a.start - b.start);
    }
  }

  // Cursors for the next poll: LANE:INDEX of the newest record we have of each lane.
  cursors() {
    return this.lanes.filter((l) => l.records.length).map((l) => {
      const last = l.records.reduce((m, r) => Math.max(m, r.index), -1);
      return `${l.lane}:${last}`;
    });
  }

  count() {
    return this.lanes.reduce((n, l) => n + l.records.length, 0);
  }

  // Records of every lane that packed several tenants, newest first.
  packed(limit = 12) {
    const out = [];
    for (const lane of this.lanes) {
      for (const r of lane.records) if (r.numTenants > 1) out.push({ lane: lane.lane, ...r });
    }
    return out.sort((a, b) => b.start - a.start).slice(0, limit);
  }

  draw() {
    const canvas = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    const W = canvas.clientWidth;
    const H = canvas.clientHeight;
    canvas.width = Math.round(W * ratio);
    canvas.height = Math.round(H * ratio);
    const g = canvas.getContext("2d");
    g.setTransform(ratio, 0, 0, ratio, 0, 0);
    g.clearRect(0, 0, W, H);
    const [t0, t1] = this.span();
    const rowH = (H - AXIS_H) / Math.max(1, this.lanes.length);
    const x = (t) => ((t - t0) / (t1 - t0 || 1)) * W;
    let drawn = 0;
    let packed = 0;
    this.lanes.forEach((lane, row) => {
      const base = (row + 1) * rowH - 4;
      const maxTokens = lane.records.reduce((m, r) => Math.max(m, r.tokens), 1);
      g.fillStyle = "#eef1f5";
      g.fillRect(0, base, W, 1);
      for (const r of lane.records) {
        if (r.start + r.dur < t0) continue;
        const h = r.cls === "io" ? 4 : r.cls === "control" ? 6
          : 6 + (rowH - 18) * Math.sqrt(r.tokens / maxTokens);
        const left = x(r.start);
        const w = Math.max(1, x(r.start + r.dur) - left);
        g.fillStyle = CLASS_COLORS[r.cls] || CLASS_COLORS.control;
        g.fillRect(left, base - h, w, h);
        if (r.numTenants > 1) {
          g.fillStyle = PACKED;
          g.fillRect(left, base - h - 3, w, 3);
          packed += 1;
        }
        drawn += 1;
      }
      g.font = "11px sans-serif";
      g.fillStyle = "rgba(255, 255, 255, 0.85)";
      g.fillRect(3, row * rowH + 2, g.measureText(lane.lane).width + 6, 15);
      g.fillStyle = "#6b7a8c";
      g.fillText(lane.lane, 6, row * rowH + 13);
    });
    this.axis(g, t0, t1, W, H, x);
    this.layout = { t0, t1, W, rowH };
    canvas.dataset.records = String(drawn);
    canvas.dataset.multiTenantCycles = String(packed);
  }

  span() {
    let lo = Infinity;
    let hi = -Infinity;
    for (const lane of this.lanes) {
      for (const r of lane.records) { lo = Math.min(lo, r.start); hi = Math.max(hi, r.start + r.dur); }
    }
    if (lo === Infinity) { const now = Date.now() / 1000; return [now - 60, now]; }
    if (this.windowS > 0) lo = Math.max(lo, hi - this.windowS);
    return [lo, hi + (hi - lo) * 0.01 + 1e-3];
  }

  axis(g, t0, t1, W, H, x) {
    g.fillStyle = "#6b7a8c";
    g.font = "10px sans-serif";
    const steps = [0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600];
    const step = steps.find((s) => (t1 - t0) / s <= 8) || 7200;
    for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
      g.fillRect(x(t), H - AXIS_H, 1, 4);
      g.fillText(step < 1 ? `${clock(t)}.${Math.round((t % 1) * 10)}` : clock(t), x(t) + 2, H - 6);
    }
  }

  hover(event) {
    const layout = this.layout;
    if (!layout) return;
    const box = this.canvas.getBoundingClientRect();
    const mx = event.clientX - box.left;
    const row = Math.floor((event.clientY - box.top) / layout.rowH);
    const lane = this.lanes[row];
    const t = layout.t0 + (mx / layout.W) * (layout.t1 - layout.t0);
    const slack = (3 / layout.W) * (layout.t1 - layout.t0);
    const hit = lane && lane.records.filter((r) => r.start - slack <= t && t <= r.start + r.dur + slack)
      .sort((a, b) => b.tokens - a.tokens)[0];
    if (!hit) { this.tip.hidden = true; return; }
    const hidden = hit.numTenants - hit.tenants.length;
    this.tip.textContent = [
      `#${hit.index} ${hit.kind} · ${lane.lane} · ${clock(hit.start)}`,
      hit.cls === "io" ? `IO ${seconds(hit.io)}`
        : `engine ${seconds(hit.engine)}${hit.kind === "cycle" ? ` (fwd/bwd ${seconds(hit.train)}, optim ${seconds(hit.optim)})` : ""}`,
      `${int(hit.ops)} ops · ${int(hit.tokens)} tokens · ${int(hit.models)} models · longest wait ${seconds(hit.wait)}`,
      `tenants: ${hit.tenants.join(", ") || "–"}${hidden > 0 ? ` (+${hidden} other)` : ""}`,
    ].join("\n");
    this.tip.hidden = false;
    this.tip.style.left = `${Math.min(mx + 12, layout.W - 300)}px`;
    this.tip.style.top = `${event.clientY - box.top + 12}px`;
  }
}
