// Line charts as hand-made SVG: axes with round ticks, one polyline per series (broken at
// missing values), an optional min/max band for downsampled series, markers when there are few
// points, and a hover readout. The server buckets long series (at most ~2,000 points reach the
// page), so the SVG stays small; `data-points` on the <svg> says how many points series 0 drew.

import { num } from "./format.js";

const NS = "http://www.w3.org/2000/svg";
const MARGIN = { left: 52, right: 12, top: 10, bottom: 24 };
const MARKERS_UP_TO = 60;

function svgEl(tag, attrs = {}) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

// About `count` round tick values covering [lo, hi].
export function niceTicks(lo, hi, count = 4) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    out.push(Number(v.toPrecision(12)));
  }
  return out;
}

function extent(series, keys) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const s of series) {
    for (const key of keys) {
      for (const v of s[key] || []) {
        if (v != null && Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
      }
    }
  }
  if (lo === Infinity) return [0, 1];
  if (lo === hi) { const pad = Math.abs(lo) * 0.1 || 1; return [lo - pad, hi + pad]; }
  return [lo, hi];
}

// Index of the x nearest `target` in the sorted array `xs`.
function nearest(xs, target) {
  let a = 0;
  let b = xs.length - 1;
  while (b - a > 1) {
    const mid = (a + b) >> 1;
    if (xs[mid] < target) a = mid; else b = mid;
  }
  return Math.abs(xs[a] - target) <= Math.abs(xs[b] - target) ? a : b;
}

// Draw `spec` into `container` (replacing what was there).
// spec: {title, series: [{label, x, y, lo?, hi?, color, dashed?}], width?, height?,
//        xFormat?, yFormat?, xLabel?, yRange?}
export function lineChart(container, spec) {
  const W = spec.width || 480;
  const H = spec.height || 170;
  const series = spec.series.filter((s) => s.x.length);
  const fx = spec.xFormat || num;
  const fy = spec.yFormat || num;
  const [x0, x1] = extent(series, ["x"]);
  const [y0, y1] = spec.yRange || extent(series, ["y", "lo", "hi"]);
  const px = (x) => MARGIN.left + ((x - x0) / (x1 - x0 || 1)) * (W - MARGIN.left - MARGIN.right);
  const py = (y) => H - MARGIN.bottom - ((y - y0) / (y1 - y0 || 1)) * (H - MARGIN.top - MARGIN.bottom);
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
  svg.setAttribute("aria-label", spec.title);
  for (const t of niceTicks(y0, y1)) {
    svg.append(svgEl("line", { class: "grid", x1: MARGIN.left, x2: W - MARGIN.right, y1: py(t), y2: py(t) }));
    const label = svgEl("text", { class: "tick", x: MARGIN.left - 6, y: py(t) + 3, "text-anchor": "end" });
    label.textContent = fy(t);
    svg.append(label);
  }
  for (const t of niceTicks(x0, x1, 5)) {
    const label = svgEl("text", { class: "tick", x: px(t), y: H - 8, "text-anchor": "middle" });
    label.textContent = fx(t);
    svg.append(label);
  }
  svg.append(svgEl("line", { class: "axis", x1: MARGIN.left, x2: W - MARGIN.right, y1: H - MARGIN.bottom, y2: H - MARGIN.bottom }));
  let drawn = 0;
  series.forEach((s, i) => {
    if (s.lo && s.hi) svg.append(band(s, px, py));
    const segments = [[]];
    s.x.forEach((x, j) => {
      const y = s.y[j];
      if (y == null || !Number.isFinite(y)) { segments.push([]); return; }
      segments[segments.length - 1].push(`${px(x).toFixed(1)},${py(y).toFixed(1)}`);
    });
    for (const points of segments.filter((p) => p.length)) {
      if (i === 0) drawn += points.length;
      svg.append(svgEl("polyline", {
        points: points.join(" "), fill: "none", stroke: s.color, "stroke-width": 1.6,
        "stroke-dasharray": s.dashed ? "4 3" : "none", "stroke-linejoin": "round",
      }));
      if (s.x.length <= MARKERS_UP_TO) {
        for (const p of points) {
          const [cx, cy] = p.split(",");
          svg.append(svgEl("circle", { cx, cy, r: 2.4, fill: s.color }));
        }
      }
    }
  });
  svg.dataset.points = String(drawn);
  const readout = document.createElement("div");
  readout.className = "readout";
  readout.textContent = series.length ? legendText(series, fy) : "no data yet";
  hover(svg, series, px, py, x0, x1, W, H, readout, fx, fy);
  const title = document.createElement("div");
  title.className = "title";
  title.textContent = spec.title;
  container.replaceChildren(title, readout, svg);
}

function band(s, px, py) {
  const top = s.x.map((x, j) => (s.hi[j] == null ? null : `${px(x).toFixed(1)},${py(s.hi[j]).toFixed(1)}`));
  const bottom = s.x.map((x, j) => (s.lo[j] == null ? null : `${px(x).toFixed(1)},${py(s.lo[j]).toFixed(1)}`));
  const points = [...top.filter(Boolean), ...bottom.filter(Boolean).reverse()].join(" ");
  return svgEl("polygon", { class: "band", points, fill: s.color });
}

function legendText(series, fy) {
  return series.map((s) => {
    const last = [...s.y].reverse().find((v) => v != null && Number.isFinite(v));
    return `${s.label} ${last == null ? "–" : fy(last)}`;
  }).join("  ·  ");
}

function hover(svg, series, px, py, x0, x1, W, H, readout, fx, fy) {
  if (!series.length) return;
  const cursor = svgEl("line", { class: "cursor", y1: MARGIN.top, y2: H - MARGIN.bottom, visibility: "hidden" });
  svg.append(cursor);
  const idle = readout.textContent;
  svg.addEventListener("mousemove", (event) => {
    const box = svg.getBoundingClientRect();
    const sx = ((event.clientX - box.left) / box.width) * W;
    const x = x0 + ((sx - MARGIN.left) / (W - MARGIN.left - MARGIN.right)) * (x1 - x0);
    const s = series[0];
    const j = nearest(s.x, x);
    cursor.setAttribute("x1", px(s.x[j]));
    cursor.setAttribute("x2", px(s.x[j]));
    cursor.setAttribute("visibility", "visible");
    readout.textContent = `${fx(s.x[j])}: ` + series.map((t) => {
      const k = nearest(t.x, s.x[j]);
      return `${t.label} ${fy(t.y[k])}`;
    }).join("  ·  ");
  });
  svg.addEventListener("mouseleave", () => {
    cursor.setAttribute("visibility", "hidden");
    readout.textContent = idle;
  });
}
