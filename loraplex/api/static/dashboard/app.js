// The dashboard's entry point: sign-in, the two views (#view=tenant, #view=operator) and the
// polling loop that keeps the shown view live (every 2 s, paused while the tab is hidden).
//
// window.loraplexDashboard exposes what a test or a curious operator may read: the signed-in
// principal, the views, and per view how long its first full render took (ms since
// navigation, and of the refresh itself: requests + drawing).

import { ApiError, currentKey, forgetKey, getJSON, readFragment, setKey } from "./api.js";
import { OperatorView } from "./operator_view.js";
import { TenantView } from "./tenant_view.js";

const state = { principal: null, view: "tenant", timings: {}, refreshes: 0, lastError: null };
window.loraplexDashboard = state;

const $ = (id) => document.getElementById(id);
let views = {};
let timer = null;
let pollMs = 2000;

async function start() {
  const params = readFragment();
  pollMs = Math.max(250, Number(params.get("poll")) || pollMs);
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    setKey($("key-input").value.trim());
    signIn();
  });
  $("logout").addEventListener("click", () => {
    forgetKey();
    location.hash = "";
    location.reload();
  });
  window.addEventListener("hashchange", () => show(viewFromHash()));
  document.addEventListener("visibilitychange", () => { if (!document.hidden) poll(); });
  if (currentKey()) signIn(); else showLogin();
}

function viewFromHash() {
  return new URLSearchParams(location.hash.replace(/^#/, "")).get("view") || "tenant";
}

function showLogin(message) {
  for (const id of ["tenant-view", "operator-view", "tabs", "who", "banner"]) $(id).hidden = true;
  $("login").hidden = false;
  $("login-error").hidden = !message;
  $("login-error").textContent = message || "";
}

async function signIn() {
  try {
    state.principal = await getJSON("/api/v1/loraplex/dashboard/tenant", { limit: 1 });
  } catch (error) {
    forgetKey();
    showLogin(error instanceof ApiError && error.status === 401
      ? `That key was refused: ${error.message}` : `Could not reach the server: ${error.message}`);
    return;
  }
  const p = state.principal;
  $("login").hidden = true;
  $("tabs").hidden = false;
  $("who").hidden = false;
  $("tenant-name").textContent = p.tenant;
  $("operator-badge").hidden = !p.is_operator;
  $("operator-tab").hidden = !p.is_operator;
  views = { tenant: new TenantView($("tenant-view")) };
  // The newest run is selected first: its curves load beside the first lists.
  views.tenant.selected = p.runs.length ? p.runs[0].model_id : null;
  if (p.is_operator) views.operator = new OperatorView($("operator-view"));
  state.views = views;
  show(viewFromHash());
}

function show(name) {
  state.view = views[name] ? name : "tenant";
  for (const [key, id] of [["tenant", "tenant-view"], ["operator", "operator-view"]]) {
    $(id).hidden = key !== state.view;
  }
  for (const link of document.querySelectorAll("#tabs a")) {
    link.classList.toggle("active", link.dataset.view === state.view);
  }
  document.body.dataset.view = state.view;
  poll();
}

// One refresh at a time: a poll asked for while one runs (a tab switch) runs right after it.
let inFlight = false;
let again = false;

async function poll() {
  clearTimeout(timer);
  if (inFlight) { again = true; return; }
  const name = state.view;
  const view = views[name];
  if (!view || document.hidden) return;
  inFlight = true;
  const began = performance.now();
  try {
    await view.refresh();
    const done = performance.now();
    if (!state.timings[name]) {
      state.timings[name] = { since_navigation_ms: done, refresh_ms: done - began };
    }
    state.refreshes += 1;
    state.lastError = null;
    document.body.dataset.rendered = Object.keys(state.timings).join(" ");
    $("banner").hidden = true;
    $("live").classList.remove("stale");
  } catch (error) {
    state.lastError = String(error.message || error);
    $("banner").textContent = `Could not refresh: ${state.lastError}`;
    $("banner").hidden = false;
    $("live").classList.add("stale");
    if (error instanceof ApiError && error.status === 401) {
      inFlight = false;
      forgetKey();
      showLogin(state.lastError);
      return;
    }
  }
  inFlight = false;
  if (again) { again = false; poll(); return; }
  if (state.view === name) timer = setTimeout(poll, pollMs);
}

start();
