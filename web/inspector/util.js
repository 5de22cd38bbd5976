// Small DOM and formatting helpers shared by the inspector's modules.

export const $ = (id) => document.getElementById(id);

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c);
  return el;
}

export const fmtInt = (n) => Number(n || 0).toLocaleString("en-US");
export const fmtCost = (n) => `$${Number(n || 0).toFixed(4)}`;
export const short = (id) => (id && id.length > 12 ? `${id.slice(0, 8)}…` : id);
/** "1 message", "2 messages". */
export const plural = (n, one, many = `${one}s`) => `${fmtInt(n)} ${n === 1 ? one : many}`;

export function textOf(msg) {
  return (msg?.parts ?? []).filter((p) => p.type === "text" || p.type === "reasoning").map((p) => p.text).join(" ");
}

export function json(value) {
  try {
    return typeof value === "string" ? value : JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

function parseTime(value) {
  if (value === null || value === undefined || value === "") return null;
  const d = typeof value === "number" ? new Date(value * 1000) : new Date(value);
  return Number.isNaN(d.getTime()) ? null : d;
}

/** "12 s ago", "5 min ago", "3 h ago", "2 d ago", else the date. */
export function relative(d, now = Date.now()) {
  const s = Math.round((now - d.getTime()) / 1000);
  if (s < -5) return d.toLocaleString();
  if (s < 5) return "just now";
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  if (s < 30 * 86400) return `${Math.floor(s / 86400)} d ago`;
  return d.toLocaleDateString();
}

/** A <time> showing a relative time, the exact one on hover; refreshed by refreshTimes(). */
export function timeEl(value, note = "") {
  const d = parseTime(value);
  if (!d) return null;
  const exact = d.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
  return h("time", { datetime: d.toISOString(), title: note ? `${exact} (${note})` : exact, text: relative(d) });
}

export function refreshTimes(root = document) {
  const now = Date.now();
  for (const t of root.querySelectorAll("time[datetime]")) {
    const text = relative(new Date(t.getAttribute("datetime")), now);
    if (t.textContent !== text) t.textContent = text;
  }
}

// -- the token's scopes, read from its payload (not verified: the hub does that) -------------
const RANK = { read: 0, write: 1, admin: 2 };

/** {scopes, exp} of a JWT, or null when it does not decode. */
export function tokenClaims(token) {
  if (!token) return null;
  try {
    const part = token.split(".")[1];
    const b64 = part.replace(/-/g, "+").replace(/_/g, "/").padEnd(Math.ceil(part.length / 4) * 4, "=");
    const claims = JSON.parse(atob(b64));
    return claims && typeof claims === "object" ? claims : null;
  } catch {
    return null;
  }
}

/** Whether the token may do something needing `level` on `sessionId` (no token: the hub has no auth, or says so). */
export function allows(token, level, sessionId) {
  if (!token) return true;
  const claims = tokenClaims(token);
  if (!claims || typeof claims.scopes !== "object" || !claims.scopes) return false;
  if (typeof claims.exp === "number" && claims.exp * 1000 <= Date.now()) return false;
  let best = -1;
  for (const key of ["*", sessionId]) {
    const got = key !== null && key !== undefined ? claims.scopes[key] : undefined;
    if (got in RANK) best = Math.max(best, RANK[got]);
  }
  return best >= RANK[level];
}
