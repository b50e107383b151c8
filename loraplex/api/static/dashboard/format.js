// Number, size, time and money formatting, and small DOM helpers shared by the views.

export function int(n) {
  return n == null ? "–" : Math.round(n).toLocaleString("en-US");
}

export function num(v, digits = 4) {
  if (v == null || !Number.isFinite(v)) return "–";
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(2);
  return Number(v.toPrecision(digits)).toString();
}

export function bytes(n) {
  if (n == null) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${i === 0 ? v : v.toFixed(1)} ${units[i]}`;
}

export function seconds(s) {
  if (s == null || !Number.isFinite(s)) return "–";
  if (s < 1e-3) return `${(s * 1e6).toFixed(0)} µs`;
  if (s < 1) return `${(s * 1e3).toFixed(1)} ms`;
  if (s < 120) return `${s.toFixed(2)} s`;
  if (s < 7200) return `${(s / 60).toFixed(1)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

export function usd(v) {
  if (v == null) return "–";
  if (v !== 0 && Math.abs(v) < 0.01) return `$${v.toPrecision(2)}`;
  return `$${v.toFixed(2)}`;
}

export function ago(unixSeconds, now = Date.now() / 1000) {
  if (unixSeconds == null) return "–";
  const d = Math.max(0, now - unixSeconds);
  return d < 1 ? "just now" : `${seconds(d)} ago`;
}

export function clock(unixSeconds) {
  return new Date(unixSeconds * 1000).toLocaleTimeString("en-GB", { hour12: false });
}

export function short(id, keep = 10) {
  return id.length <= keep * 2 + 1 ? id : `${id.slice(0, keep)}…${id.slice(-keep)}`;
}

// el("td", {class: "num", title: "x"}, "text", childNode, ...): a new element.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children.flat()) {
    if (child == null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// Replace a table body's rows (an empty list shows `empty` across all columns).
export function fillRows(table, rows, empty = "nothing yet") {
  const body = table.tBodies[0];
  const columns = table.tHead.rows[0].cells.length;
  body.replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { class: "empty", colspan: columns }, empty))]));
}

export function card(label, value, sub) {
  return el("div", { class: "card" }, el("div", { class: "label" }, label),
    el("div", { class: "value" }, value), sub ? el("div", { class: "sub" }, sub) : null);
}
