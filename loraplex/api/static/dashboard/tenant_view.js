// The tenant view: the caller's training runs (with live curves of every metric of the selected
// one), checkpoints, sampling sessions and usage priced in both billing modes.

import { getJSON } from "./api.js";
import { lineChart } from "./charts.js";
import { ago, bytes, card, el, fillRows, int, num, seconds, usd } from "./format.js";

const MAX_POINTS = 1500;
const TRAIN = "#4c7fd9";
const EVAL = "#e0803a";

export class TenantView {
  constructor(root) {
    this.root = root;
    this.selected = null;
    this.runs = [];
  }

  // One refresh. The selected run's curves are fetched beside the lists (a poll's usual case:
  // the selection did not change), after them only when the selection is new. `this.phases`
  // keeps how long its parts took (ms, performance.now()).
  async refresh() {
    const t0 = performance.now();
    const guess = this.selected;
    const curves = guess ? this.fetchRun(guess) : null;
    curves?.catch(() => {});  // awaited below only when still wanted
    const [view, usage] = await Promise.all([
      getJSON("/api/v1/loraplex/dashboard/tenant"), getJSON("/api/v1/loraplex/usage")]);
    this.runs = view.runs;
    if (!this.runs.some((r) => r.model_id === this.selected)) {
      this.selected = this.runs.length ? this.runs[0].model_id : null;
    }
    this.renderCards(view, usage);
    this.renderRuns(view);
    this.renderCheckpoints(view);
    this.renderSamplers(view);
    this.renderUsage(usage);
    const t1 = performance.now();
    const run = await this.refreshRun(this.selected === guess ? curves : null);
    this.phases = { lists_ms: t1 - t0, curves_ms: performance.now() - t1, ...run };
  }

  select(modelId) {
    this.selected = modelId;
    for (const row of this.root.querySelectorAll("#runs-table tbody tr")) {
      row.classList.toggle("selected", row.dataset.runId === modelId);
    }
    return this.refreshRun();
  }

  renderCards(view, usage) {
    const t = usage.totals;
    const bill = t.bill_usd;
    const quota = usage.quotas;
    this.root.querySelector("#usage-cards").replaceChildren(
      card("Training runs", int(view.num_runs),
        `${int(quota.training_runs.used)} live of ${int(quota.training_runs.limit)} allowed`),
      card("Trained tokens", int(t.tokens.trained_tokens), `${int(t.tokens.forward_tokens)} forward-only`),
      card("Sampled tokens", int(t.tokens.sampled_tokens),
        `${int(t.tokens.prompt_tokens)} prompt, ${int(t.tokens.cache_hit_tokens)} cached`),
      card("Engine time", seconds(t.engine_s.total), `${int(t.tokens.num_ops)} ops`),
      card("Bill, per rollout", usd(bill.per_rollout.total), "every sample pays its prompt"),
      card("Bill, cache aware", usd(bill.cache_aware.total), "shared prompts billed once"),
      card("Checkpoint storage", bytes(quota.checkpoint_bytes.used),
        `of ${bytes(quota.checkpoint_bytes.limit)} quota`),
    );
  }

  renderRuns(view) {
    this.root.querySelector("#runs-count").textContent = `${view.runs.length} of ${view.num_runs}`;
    const rows = view.runs.map((r) => el("tr", {
      class: `clickable${r.model_id === this.selected ? " selected" : ""}`,
      dataset: { runId: r.model_id }, onclick: () => this.select(r.model_id),
    },
    el("td", {}, el("code", {}, r.model_id)),
    el("td", {}, r.base_model),
    el("td", { class: "num" }, int(r.num_steps)),
    el("td", { class: "num" }, int(r.num_trained_tokens)),
    el("td", {}, adapterText(r.lora)),
    el("td", {}, el("span", { class: r.is_live ? "pill live" : "pill" }, r.is_live ? "live" : "released")),
    el("td", {}, ago(r.last_request_time, view.now))));
    fillRows(this.root.querySelector("#runs-table"), rows, "no training runs yet");
  }

  renderCheckpoints(view) {
    this.root.querySelector("#checkpoints-count").textContent =
      `${view.checkpoints.length} of ${view.num_checkpoints}`;
    const rows = view.checkpoints.map((c) => el("tr", { dataset: { path: c.tinker_path } },
      el("td", {}, el("code", {}, c.tinker_path)),
      el("td", {}, c.kind),
      el("td", { class: "num" }, bytes(c.size_bytes)),
      el("td", {}, ago(c.created_at, view.now)),
      el("td", {}, c.ttl_left_s == null ? "kept" : seconds(c.ttl_left_s)),
      el("td", {}, c.public ? el("span", { class: "pill public" }, "published") : "private"),
      el("td", { class: "evals" }, evalText(c.evals || [])),
      el("td", {}, el("a", { href: c.download_url, download: `${c.name}.tar`,
        title: "signed link, valid for an hour" }, "download"))));
    fillRows(this.root.querySelector("#checkpoints-table"), rows, "no checkpoints yet");
  }

  renderSamplers(view) {
    this.root.querySelector("#samplers-count").textContent =
      `${view.sampling_sessions.length} of ${view.num_sampling_sessions}`;
    const rows = view.sampling_sessions.map((s) => el("tr", {},
      el("td", {}, el("code", {}, s.sampler_id)),
      el("td", {}, samplerSource(s)),
      el("td", {}, s.base_model),
      el("td", {}, ago(s.created_at, view.now))));
    fillRows(this.root.querySelector("#samplers-table"), rows, "no sampling sessions yet");
  }

  renderUsage(usage) {
    const rows = usage.runs.map((r) => el("tr", {},
      el("td", {}, r.run_id ? el("code", {}, r.run_id) : "base model sampling"),
      el("td", { class: "num" }, int(r.tokens.trained_tokens)),
      el("td", { class: "num" }, int(r.tokens.rollout_prompt_tokens + r.tokens.forward_tokens)),
      el("td", { class: "num" }, int(r.tokens.sampled_tokens)),
      el("td", { class: "num" }, num(r.engine_s.total, 3)),
      el("td", { class: "num" }, usd(r.bill_usd.per_rollout.total)),
      el("td", { class: "num" }, usd(r.bill_usd.cache_aware.total))));
    fillRows(this.root.querySelector("#usage-table"), rows, "no metered usage yet");
    const sheet = usage.price_sheet;
    this.root.querySelector("#usage-note").textContent =
      `Priced with ${sheet.name} (effective ${sheet.effective}); ${usage.notes.join("; ")}.`;
  }

  fetchRun(modelId) {
    return getJSON(`/api/v1/loraplex/training_runs/${encodeURIComponent(modelId)}/metrics`,
      { max_points: MAX_POINTS });
  }

  // Draw the selected run's facts and curves (`pending`: its curves, already requested).
  // Returns how long waiting for the curves and drawing them took (ms).
  async refreshRun(pending = null) {
    const detail = this.root.querySelector("#run-detail");
    const run = this.runs.find((r) => r.model_id === this.selected);
    if (!run) { detail.hidden = true; return {}; }
    const t0 = performance.now();
    const m = await (pending || this.fetchRun(run.model_id));
    if (run.model_id !== this.selected) return {}; // the user picked another run meanwhile
    const t1 = performance.now();
    detail.hidden = false;
    this.root.querySelector("#run-title").textContent = run.model_id;
    this.root.querySelector("#run-facts").replaceChildren(...runFacts(run, m));
    drawCurves(this.root.querySelector("#run-charts"), m);
    return { curves_wait_ms: t1 - t0, curves_draw_ms: performance.now() - t1 };
  }
}

function adapterText(lora) {
  const targets = ["attn", "mlp", "unembed"].filter((t) => lora[`train_${t}`]).join("+");
  return `rank ${lora.rank}, α ${lora.alpha} · ${targets}`;
}

function samplerSource(s) {
  if (s.source === "base") return "the base model";
  if (s.source === "checkpoint") return el("code", {}, s.model_path || "checkpoint");
  return [`${s.source} of `, el("code", {}, s.model_id || "?")];
}

function runFacts(run, m) {
  const fact = (label, value) => el("span", {}, `${label} `, el("b", {}, value));
  const open = m.train.open_step;
  const opt = run.optimizer_config || {};
  return [
    fact("steps", int(m.num_steps)), fact("trained tokens", int(m.num_trained_tokens)),
    fact("adapter", adapterText(run.lora)), fact("seed", String(run.lora.seed ?? "–")),
    fact("optimizer", Object.keys(opt).length ? JSON.stringify(opt) : "AdamW"),
    fact("base", run.base_model), fact("session", run.session_id),
    m.train.bucket > 1 ? fact("curve", `mean of ${m.train.bucket} steps per point, band = min/max`) : null,
    open ? fact("in progress", `step ${open.step}`) : null,
  ].filter(Boolean);
}

// One chart per metric key (train solid, forward-only evaluations dashed), then tokens/step.
function drawCurves(container, m) {
  const keys = [...new Set([...Object.keys(m.train.metrics), ...Object.keys(m.forward.metrics)])];
  keys.sort((a, b) => (a === "loss:sum" ? -1 : b === "loss:sum" ? 1 : a.localeCompare(b)));
  const charts = [];
  for (const key of keys) {
    const series = [];
    if (m.train.metrics[key]) series.push(seriesOf(m.train, key, "train", TRAIN, false));
    if (m.forward.metrics[key]) series.push(seriesOf(m.forward, key, "eval", EVAL, true));
    charts.push([key, series]);
  }
  if (m.train.step.length) {
    charts.push(["tokens per step", [{ label: "tokens", x: m.train.step,
      y: m.train.tokens.map((t, i) => t / m.train.count[i]), color: "#7a8aa0" }]]);
  }
  const nodes = charts.map(([key, series]) => {
    const node = el("div", { class: "chart", dataset: { metric: key } });
    lineChart(node, { title: key, series, xFormat: (v) => int(v) });
    return node;
  });
  container.replaceChildren(...(nodes.length ? nodes
    : [el("p", { class: "note" }, "No finished steps yet: curves appear after the first optim_step.")]));
}

function seriesOf(s, key, label, color, dashed) {
  const out = { label, x: s.step, y: s.metrics[key], color, dashed };
  if (s.bucket > 1 && s.min && s.max) { out.lo = s.min[key]; out.hi = s.max[key]; }
  return out;
}

// `loraplex eval` scores of a checkpoint: "task metric value", the newest run of each task.
function evalText(evals) {
  if (!evals.length) return "–";
  return evals.map((e) => `${e.task} ${e.metric} ${Number(e.value).toFixed(4)}`).join(" · ");
}
