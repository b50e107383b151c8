// The API key and the JSON requests made with it.
//
// The key comes from the login field or from the URL fragment (#key=tml-...; a fragment never
// reaches the server, so it is in no access log). It is kept in this tab's sessionStorage and
// removed from the address bar at once; every request sends it as the X-API-Key header.

const STORAGE_KEY = "loraplex.key";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// The fragment's parameters; a key found there moves to sessionStorage and leaves the URL.
export function readFragment() {
  const params = new URLSearchParams(location.hash.replace(/^#/, ""));
  const key = params.get("key");
  if (key) {
    sessionStorage.setItem(STORAGE_KEY, key);
    params.delete("key");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
  }
  return params;
}

export function currentKey() {
  return sessionStorage.getItem(STORAGE_KEY);
}

export function setKey(key) {
  sessionStorage.setItem(STORAGE_KEY, key);
}

export function forgetKey() {
  sessionStorage.removeItem(STORAGE_KEY);
}

export async function getJSON(path, params = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params)) {
    for (const one of Array.isArray(v) ? v : [v]) {
      if (one != null) url.searchParams.append(k, one);
    }
  }
  const response = await fetch(url, { headers: { "X-API-Key": currentKey() || "" } });
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      const body = await response.json();
      message = body.error || body.detail || message;
    } catch (_) { /* not JSON */ }
    throw new ApiError(response.status, message);
  }
  return response.json();
}

// Fetch with the key and hand the body to the browser as a file download.
export async function download(path, filename) {
  const response = await fetch(path, { headers: { "X-API-Key": currentKey() || "" } });
  if (!response.ok) throw new ApiError(response.status, `${response.status} ${response.statusText}`);
  const url = URL.createObjectURL(await response.blob());
  const link = Object.assign(document.createElement("a"), { href: url, download: filename });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
