// The inspector: every session, live. A fold of the hub's event logs: the registry stream
// builds the sessions list, a session's stream builds its message tree (message.appended
// carries each parent), compactions, frozen prompt and event log; stream frames grow
// messages as deltas arrive. After a drop the client resubscribes from the last seq, so
// the view catches up by itself. The token never reaches the URL, the console or a log.
import { HubClient, LiveMessages, hubUrlFor } from "./sessionhub.js";

const PAGE = 100; // items rendered at once: a 10,000-message branch is paged, never all in the DOM
const LOG_KEEP = 500;
const LOG_SHOW = 200;
const $ = (id) => document.getElementById(id);

function h(tag, attrs = {}, ...children) {
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

const fmtInt = (n) => Number(n || 0).toLocaleString("en-US");
const fmtCost = (n) => `$${Number(n || 0).toFixed(4)}`;
const short = (id) => (id && id.length > 12 ? `${id.slice(0, 8)}…` : id);
function fmtTime(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleString();
}
function textOf(msg) {
  return (msg?.parts ?? []).filter((p) => p.type === "text").map((p) => p.text).join(" ");
}
function json(value) {
  try {
    return typeof value === "string" ? value : JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

// -- auth: the token comes from #token=… (then leaves the URL) or the form --------------------
function readHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  const token = params.get("token");
  if (token !== null) {
    sessionStorage.setItem("sessionhub.token", token);
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
  }
  return { session: params.get("session"), message: params.get("message") };
}
function setHash(sessionId) {
  history.replaceState(null, "", location.pathname + location.search + (sessionId ? `#session=${encodeURIComponent(sessionId)}` : ""));
}

// -- the message tree of one session -------------------------------------------------------
class SessionModel {
  constructor(id) {
    this.id = id;
    this.reset();
  }

  reset() {
    this.nodes = new Map(); // id -> {id, parentId, children: [], order, msg}
    this.roots = [];
    this.order = 0;
    this.latest = null;
    this.compactions = [];
    this.prompt = null;
    this.events = [];
    this.lastSeq = 0;
    this.readySeq = null;
    this.structureVersion = 0;
    this.note = "";
  }

  get caughtUp() {
    return this.readySeq !== null && this.lastSeq >= this.readySeq;
  }

  add(msg, parentId) {
    if (!msg || this.nodes.has(msg.id)) return;
    const parent = parentId ? this.nodes.get(parentId) : null;
    const node = { id: msg.id, parentId: parent ? parent.id : null, children: [], order: ++this.order, msg };
    this.nodes.set(msg.id, node);
    (parent ? parent.children : this.roots).push(node.id);
    this.latest = node.id;
    this.structureVersion++;
  }

  siblingsOf(node) {
    return node.parentId ? this.nodes.get(node.parentId).children : this.roots;
  }

  remove(ids, reparented) {
    for (const [child, newParent] of reparented ?? []) {
      const node = this.nodes.get(child);
      if (!node) continue;
      const from = this.siblingsOf(node);
      from.splice(from.indexOf(child), 1);
      node.parentId = newParent && this.nodes.has(newParent) ? newParent : null;
      (node.parentId ? this.nodes.get(node.parentId).children : this.roots).push(child);
    }
    for (const id of ids ?? []) {
      const node = this.nodes.get(id);
      if (!node) continue;
      const from = this.siblingsOf(node);
      if (from.includes(id)) from.splice(from.indexOf(id), 1);
      this.nodes.delete(id);
    }
    this.latest = null;
    let best = -1;
    for (const n of this.nodes.values()) if (n.order > best) [best, this.latest] = [n.order, n.id];
    this.structureVersion++;
  }

  /** Applies one logged event; returns what changed ("structure", "message", "context"...). */
  apply(ev) {
    this.lastSeq = ev.seq;
    this.events.push(ev);
    if (this.events.length > LOG_KEEP) this.events.splice(0, this.events.length - LOG_KEEP);
    const d = ev.data ?? {};
    switch (ev.type) {
      case "message.appended":
        this.add(d.message, d.parent_id);
        return "structure";
      case "message.updated": {
        const node = d.message && this.nodes.get(d.message.id);
        if (node) node.msg = d.message;
        return node ? "message" : null;
      }
      case "message.deleted":
        this.remove(d.ids, d.reparented);
        return "structure";
      case "messages.cleared": {
        const keep = { events: this.events, lastSeq: this.lastSeq, readySeq: this.readySeq, prompt: this.prompt };
        this.reset();
        Object.assign(this, keep);
        this.structureVersion++;
        return "structure";
      }
      case "compaction.added":
        if (d.compaction) this.compactions.push(d.compaction);
        return "structure";
      case "prompt.updated":
        this.prompt = d.prompt ?? "";
        return "prompt";
      default:
        return ev.type.startsWith("context.") ? "context" : null;
    }
  }

  path(leafId) {
    const out = [];
    let node = this.nodes.get(leafId);
    while (node) {
      out.push(node.id);
      node = node.parentId ? this.nodes.get(node.parentId) : null;
    }
    return out.reverse();
  }

  /** The newest message under `id` (itself included): always a leaf. */
  newestUnder(id) {
    let best = this.nodes.get(id);
    const stack = [id];
    while (stack.length) {
      const node = this.nodes.get(stack.pop());
      if (node.order > best.order) best = node;
      stack.push(...node.children);
    }
    return best.id;
  }

  leaves() {
    const out = [];
    for (const n of this.nodes.values()) if (!n.children.length) out.push(n);
    return out.sort((a, b) => b.order - a.order);
  }

  /** The overlays that apply on this path (protocol: hub/overlays.py `_chosen`). */
  overlays(pathIds) {
    const index = new Map(pathIds.map((id, i) => [id, i]));
    const byStart = new Map();
    for (const c of this.compactions) {
      const s = index.get(c.from_message_id);
      if (s === undefined) continue;
      if (!byStart.has(s)) byStart.set(s, []);
      byStart.get(s).push(c);
    }
    const chosen = [];
    for (let i = 0; i < pathIds.length; ) {
      let best = null;
      for (const c of byStart.get(i) ?? []) {
        const end = index.get(c.to_message_id) ?? -1;
        if (end >= i) best = [end, c];
      }
      if (best) {
        chosen.push({ start: i, end: best[0], compaction: best[1] });
        i = best[0] + 1;
      } else i++;
    }
    return chosen;
  }
}

// -- application state ------------------------------------------------------------------------
const state = {
  client: null,
  sessions: new Map(),
  registrySub: null,
  current: null, // SessionModel
  sessionSub: null,
  pinnedLeaf: null, // null: follow the latest leaf
  viewStart: null, // null: follow the end of the branch
  expanded: new Set(), // compaction ids shown expanded
  pendingFocus: null,
  live: new LiveMessages(),
  presence: new Map(),
  blocks: [],
  renderQueued: false,
};

function notice(text) {
  const el = $("notice");
  el.textContent = text || "";
  el.hidden = !text;
}

function forbiddenText(what, needs) {
  const token = sessionStorage.getItem("sessionhub.token");
  return token
    ? `Your token does not allow ${what} (it needs ${needs}), or it is invalid or expired.`
    : `This hub needs an access token to ${what}.`;
}

function askToken(why) {
  $("token-why").textContent = why;
  $("token-form").hidden = false;
  $("token-input").focus();
}

// -- connection ---------------------------------------------------------------------------
function start() {
  const token = sessionStorage.getItem("sessionhub.token");
  $("change-token").hidden = !token;
  const client = new HubClient(hubUrlFor(location), { token, name: "inspector", role: "observer", maxBackoff: 2000 });
  state.client = client;
  client.on("state", ({ state: s, attempt }) => {
    const el = $("conn");
    el.dataset.state = s;
    el.textContent =
      s === "open" ? "Connected" : s === "reconnecting" ? `Disconnected: reconnecting${attempt > 1 ? ` (attempt ${attempt})` : ""}…` : s === "connecting" ? "Connecting…" : "Disconnected";
  });
  client.on("state", ({ state: s }) => {
    if (s === "reconnecting" && state.presence.size) {
      state.presence.clear(); // unknown while away; asked again on reconnect
      renderPresence();
    }
  });
  client.on("reconnect", () => {
    if (state.current) {
      refreshPresence();
      refreshContext();
    }
  });
  client.on("stream", onStream);
  client.on("presence", onPresence);
  client.connect().catch(() => {});
  followRegistry();
}

function restart() {
  state.registrySub = null;
  state.sessionSub = null;
  state.client?.close();
  state.sessions.clear();
  renderSessions();
  start();
  if (state.current) openSession(state.current.id);
}

// -- the sessions list ----------------------------------------------------------------------
function followRegistry() {
  state.sessions.clear();
  state.registrySub = state.client.subscribe(null, {
    reload: true,
    onEvent: (ev) => {
      const s = ev.data?.session;
      if (ev.type === "session.deleted") state.sessions.delete(ev.session_id);
      else if (s && s.id) state.sessions.set(s.id, s);
      if (state.current && ev.session_id === state.current.id) scheduleRender();
      scheduleSessions();
    },
    onReset: () => loadSessionList("The registry log was pruned: reloaded the list."),
    onError: (err) => {
      if (err.code === "forbidden") {
        loadSessionList(forbiddenText("follow the sessions registry live", "admin on *"));
      } else $("sessions-note").textContent = `Registry: ${err.message}`;
    },
  });
}

async function loadSessionList(why) {
  const note = $("sessions-note");
  try {
    const list = await state.client.request("list");
    state.sessions.clear();
    for (const s of list) state.sessions.set(s.id, s);
    note.textContent = why ? `${why} Showing a snapshot.` : "";
    note.className = why ? "warn" : "";
    renderSessions();
  } catch (err) {
    if (err.code === "forbidden") {
      const text = forbiddenText("list sessions", "read on *");
      note.textContent = text;
      note.className = "warn";
      notice(text);
      $("open-form").hidden = false;
      if (!sessionStorage.getItem("sessionhub.token")) askToken(text);
    } else note.textContent = `Cannot list sessions: ${err.message}`;
  }
}

let sessionsQueued = false;
function scheduleSessions() {
  if (sessionsQueued) return;
  sessionsQueued = true;
  requestAnimationFrame(() => {
    sessionsQueued = false;
    renderSessions();
  });
}

function renderSessions() {
  const list = [...state.sessions.values()].sort((a, b) => String(b.updated_at).localeCompare(String(a.updated_at)));
  $("session-count").textContent = `(${list.length})`;
  const ul = $("sessions");
  const focused = document.activeElement?.closest?.("#sessions li")?.dataset.id;
  ul.replaceChildren(
    ...list.map((s) => {
      const selected = state.current?.id === s.id;
      return h(
        "li",
        { role: "option", "aria-selected": selected ? "true" : "false", "data-id": s.id, tabindex: "-1", onclick: () => openSession(s.id) },
        h("span", { class: "s-name", text: s.name || "(unnamed)" }),
        h(
          "span",
          { class: "s-meta" },
          `${short(s.id)} · ${fmtInt(s.input_tokens)}/${fmtInt(s.output_tokens)} tok · ${fmtCost(s.estimated_cost)}`,
          s.parent_session_id ? h("span", { class: "badge", text: "fork" }) : null,
          s.end_reason ? h("span", { class: "badge ended", text: `ended: ${s.end_reason}` }) : null,
        ),
      );
    }),
  );
  if (focused) ul.querySelector(`li[data-id="${CSS.escape(focused)}"]`)?.focus();
}

/** Arrow keys, Home/End move through a listbox's options; Enter or Space picks one. */
function listboxKeys(ul, pick) {
  ul.addEventListener("keydown", (e) => {
    const items = [...ul.querySelectorAll("li[role=option]")];
    if (!items.length) return;
    const at = items.indexOf(document.activeElement);
    let next = null;
    if (e.key === "ArrowDown") next = items[Math.min(items.length - 1, at + 1)];
    else if (e.key === "ArrowUp") next = items[Math.max(0, at - 1)];
    else if (e.key === "Home") next = items[0];
    else if (e.key === "End") next = items[items.length - 1];
    else if ((e.key === "Enter" || e.key === " ") && at >= 0) {
      e.preventDefault();
      pick(items[at].dataset.id);
      return;
    } else return;
    e.preventDefault();
    (next ?? items.find((i) => i.getAttribute("aria-selected") === "true") ?? items[0]).focus();
  });
}

// -- search --------------------------------------------------------------------------------
async function search(query) {
  const status = $("search-status");
  const ul = $("search-results");
  ul.replaceChildren();
  if (!query.trim()) {
    status.textContent = "";
    return;
  }
  status.textContent = "Searching…";
  try {
    const hits = await state.client.request("search", { query, limit: 50 });
    status.textContent = `${hits.length} hit${hits.length === 1 ? "" : "s"}`;
    ul.replaceChildren(
      ...hits.map((hit) =>
        h(
          "li",
          {},
          h(
            "button",
            { type: "button", class: "hit", "data-session": hit.session_id, "data-message": hit.id, onclick: () => openSession(hit.session_id, hit.id) },
            h("span", { class: "hit-session", text: `${state.sessions.get(hit.session_id)?.name ?? short(hit.session_id)} · ${hit.role}` }),
            hit.content.length > 140 ? `${hit.content.slice(0, 140)}…` : hit.content,
          ),
        ),
      ),
    );
  } catch (err) {
    status.textContent = err.code === "forbidden" ? forbiddenText("search across sessions", "read on *") : `Search failed: ${err.message}`;
  }
}

// -- one session ----------------------------------------------------------------------------
function openSession(id, focusMessage = null) {
  if (state.current?.id !== id) {
    state.sessionSub?.close();
    state.current = new SessionModel(id);
    state.pinnedLeaf = null;
    state.viewStart = null;
    state.expanded.clear();
    state.presence.clear();
    state.blocks = [];
    state.live = new LiveMessages();
    const model = state.current;
    state.sessionSub = state.client.subscribe(id, {
      presence: true,
      reload: true,
      onReady: (r) => {
        if (state.current !== model) return;
        if (model.readySeq === null) model.readySeq = r.last_seq;
        scheduleRender();
      },
      onEvent: (ev) => {
        if (state.current !== model) return;
        const changed = model.apply(ev);
        if (ev.type === "message.updated" || ev.type === "stream.ended") state.live.applyEvent(ev);
        if (ev.type === "stream.ended") streamStatus.set(ev.data?.message_id, ev.data?.status);
        if (ev.type === "message.appended" && state.live.messages.has(ev.data?.message?.id)) {
          // A stream frame came before the logged append: keep what the deltas built.
          model.nodes.get(ev.data.message.id).msg = state.live.messages.get(ev.data.message.id);
        }
        if (changed === "context") refreshContext();
        if (changed === "structure" && state.pinnedLeaf && ev.type === "message.appended") {
          // A pinned branch that grows keeps following its own tip.
          if (ev.data?.parent_id === state.pinnedLeaf) state.pinnedLeaf = ev.data.message.id;
        }
        scheduleRender(changed === "message" ? ev.data?.message?.id : null);
      },
      onReset: (frame) => snapshot(model, frame),
      onError: (err) => {
        if (state.current !== model) return;
        $("session-status").textContent =
          err.code === "forbidden" ? forbiddenText("read this session", `read on ${id}`) : `Cannot follow this session: ${err.message}`;
        if (err.code === "forbidden") notice($("session-status").textContent);
      },
    });
    refreshPresence();
    refreshContext();
  }
  state.pendingFocus = focusMessage;
  setHash(id);
  $("empty").hidden = true;
  $("session-view").hidden = false;
  renderSessions();
  scheduleRender();
}

const streamStatus = new Map();

/** The log cannot serve the position (pruned): rebuild from the hub's snapshot of the latest branch. */
async function snapshot(model, frame) {
  model.reset();
  model.readySeq = frame.last_seq;
  model.lastSeq = frame.last_seq;
  model.note = "The event log was pruned: showing the latest branch as the hub returns it (overlays applied); other branches are not known.";
  try {
    const history = await state.client.request("get_history", { session_id: model.id });
    let parent = null;
    for (const m of history) {
      model.add(m, parent);
      parent = m.id;
    }
  } catch (err) {
    model.note = `Cannot reload the session: ${err.message}`;
  }
  scheduleRender();
}

async function refreshPresence() {
  const model = state.current;
  try {
    const list = await state.client.request("presence", { session_id: model.id });
    if (state.current !== model) return;
    state.presence = new Map(list.map((e) => [e.connection_id, e]));
  } catch {
    // forbidden or dropped: the session status says so
  }
  renderPresence();
}

function onPresence(frame) {
  if (frame.session_id !== state.current?.id) return;
  if (frame.action === "leave") state.presence.delete(frame.entry.connection_id);
  else state.presence.set(frame.entry.connection_id, frame.entry);
  renderPresence();
}

let contextTimer = null;
function refreshContext() {
  clearTimeout(contextTimer);
  contextTimer = setTimeout(async () => {
    const model = state.current;
    if (!model) return;
    try {
      const blocks = await state.client.request("get_context_blocks", { session_id: model.id });
      if (state.current === model) state.blocks = blocks;
    } catch {
      if (state.current === model) state.blocks = [];
    }
    renderContext();
  }, 50);
}

function onStream(frame) {
  const model = state.current;
  if (!model || frame.session_id !== model.id) return;
  const msg = state.live.apply(frame);
  if (frame.action === "end") streamStatus.set(frame.message_id, frame.status);
  else if (frame.action === "start" || frame.action === "state") streamStatus.set(frame.message_id, "streaming");
  const node = model.nodes.get(frame.message_id);
  if (node && msg) node.msg = msg;
  scheduleRender(frame.message_id);
}

// -- rendering -------------------------------------------------------------------------------
let dirtyMessages = new Set();
let fullRender = false;
function scheduleRender(onlyMessage = null) {
  if (onlyMessage) dirtyMessages.add(onlyMessage);
  else fullRender = true;
  if (state.renderQueued) return;
  state.renderQueued = true;
  requestAnimationFrame(() => {
    state.renderQueued = false;
    const full = fullRender;
    const dirty = dirtyMessages;
    fullRender = false;
    dirtyMessages = new Set();
    if (full) renderSession();
    else for (const id of dirty) rerenderMessage(id);
  });
}

function activeLeaf(model) {
  if (state.pinnedLeaf && model.nodes.has(state.pinnedLeaf)) return state.pinnedLeaf;
  state.pinnedLeaf = null;
  return model.latest;
}

/** The branch as render items: messages, overlay headers, and the originals of expanded ones. */
function itemsOf(model, pathIds) {
  const items = [];
  let i = 0;
  for (const o of model.overlays(pathIds)) {
    for (; i < o.start; i++) items.push({ kind: "msg", id: pathIds[i] });
    items.push({ kind: "overlay", ...o });
    if (state.expanded.has(o.compaction.id)) {
      for (let j = o.start; j <= o.end; j++) items.push({ kind: "msg", id: pathIds[j], overlay: o.compaction.id });
    }
    i = o.end + 1;
  }
  for (; i < pathIds.length; i++) items.push({ kind: "msg", id: pathIds[i] });
  return items;
}

function renderSession() {
  const model = state.current;
  if (!model) return;
  const info = state.sessions.get(model.id);
  $("session-title").textContent = info?.name ?? model.id;
  const meta = [
    ["id", model.id],
    ["model", info?.model],
    ["source", info?.source],
    ["forked from", info?.parent_session_id],
    ["tokens in/out", info ? `${fmtInt(info.input_tokens)} / ${fmtInt(info.output_tokens)}` : null],
    ["cost", info ? fmtCost(info.estimated_cost) : null],
    ["ended", info?.end_reason],
    ["messages", fmtInt(model.nodes.size)],
    ["seq", model.lastSeq],
  ].filter(([, v]) => v !== null && v !== undefined && v !== "");
  $("session-meta").replaceChildren(...meta.flatMap(([k, v]) => [h("div", {}, h("dt", { text: k }), h("dd", { text: String(v) }))]));
  const view = $("session-view");
  view.dataset.caughtUp = String(model.caughtUp);
  view.dataset.messages = String(model.nodes.size);
  const status = $("session-status");
  if (!model.caughtUp && model.readySeq !== null) status.textContent = `Loading the event log… ${fmtInt(model.lastSeq)} / ${fmtInt(model.readySeq)}`;
  else if (model.note) status.textContent = model.note;
  else if (!status.textContent.startsWith("Your token") && !status.textContent.startsWith("Cannot")) status.textContent = "";

  // Navigating to a message (search hit): pick a branch through it, page to it, expand its overlay.
  const focus = state.pendingFocus && model.caughtUp && model.nodes.has(state.pendingFocus) ? state.pendingFocus : null;
  if (focus) {
    const onPath = model.path(activeLeaf(model)).includes(focus);
    if (!onPath) state.pinnedLeaf = model.newestUnder(focus);
  }
  const leaf = activeLeaf(model);
  const pathIds = leaf ? model.path(leaf) : [];
  if (focus) {
    for (const o of model.overlays(pathIds)) {
      if (pathIds.indexOf(focus) >= o.start && pathIds.indexOf(focus) <= o.end) state.expanded.add(o.compaction.id);
    }
  }
  const items = itemsOf(model, pathIds);
  if (focus) {
    const at = items.findIndex((it) => it.kind === "msg" && it.id === focus);
    state.viewStart = at + PAGE / 2 >= items.length ? null : Math.max(0, at - PAGE / 2);
  }
  renderLeaves(model, leaf);
  renderMessages(model, items, pathIds.length);
  renderPrompt(model);
  renderLog(model);
  if (focus) {
    state.pendingFocus = null;
    const el = $("messages").querySelector(`[data-id="${CSS.escape(focus)}"]`);
    if (el) {
      el.classList.add("highlight");
      el.scrollIntoView({ block: "center" });
      el.focus({ preventScroll: true });
    }
  }
}

function renderLeaves(model, leaf) {
  const leaves = model.leaves().slice(0, 200);
  const count = model.leaves().length;
  $("leaf-count").textContent = `(${count} ${count === 1 ? "leaf" : "leaves"})`;
  const focused = document.activeElement?.closest?.("#leaves li")?.dataset.id;
  $("leaves").replaceChildren(
    ...leaves.map((n) => {
      const depth = model.path(n.id).length;
      const snippet = textOf(n.msg).slice(0, 60) || n.msg.parts?.[0]?.type || "";
      return h(
        "li",
        { role: "option", tabindex: "-1", "data-id": n.id, "aria-selected": n.id === leaf ? "true" : "false", onclick: () => pickLeaf(n.id) },
        h("strong", { text: `${n.msg.role} ${short(n.id)}` }),
        ` · depth ${depth}${n.id === model.latest ? " · latest" : ""} · ${snippet}`,
      );
    }),
  );
  if (focused) $("leaves").querySelector(`li[data-id="${CSS.escape(focused)}"]`)?.focus();
}

function pickLeaf(id) {
  const model = state.current;
  state.pinnedLeaf = id === model.latest ? null : id;
  state.viewStart = null;
  renderSession();
}

function renderMessages(model, items, pathLength) {
  const box = $("messages");
  const atBottom = box.parentElement.scrollHeight - box.parentElement.scrollTop - box.parentElement.clientHeight < 40;
  const n = items.length;
  let s = state.viewStart === null ? Math.max(0, n - PAGE) : Math.min(state.viewStart, Math.max(0, n - PAGE));
  const e = Math.min(n, s + PAGE);
  const els = [];
  for (let i = s; i < e; i++) {
    const it = items[i];
    els.push(it.kind === "overlay" ? overlayEl(model, it) : messageEl(model, it.id, it.overlay));
  }
  box.replaceChildren(...els);
  box.dataset.pathLength = String(pathLength);
  for (const pager of [$("pager-top"), $("pager-bottom")]) {
    pager.replaceChildren(
      h("button", { type: "button", disabled: s === 0, onclick: () => page(Math.max(0, s - PAGE)) }, "◀ Earlier"),
      h("span", { text: n ? `Items ${fmtInt(s + 1)}–${fmtInt(e)} of ${fmtInt(n)} (${fmtInt(pathLength)} messages on this branch)` : "No messages yet" }),
      h("button", { type: "button", disabled: e >= n, onclick: () => page(s + PAGE) }, "Later ▶"),
      h("button", { type: "button", disabled: state.viewStart === null, onclick: () => page(null) }, "Latest"),
    );
  }
  if (state.viewStart === null && atBottom && !state.pendingFocus) box.parentElement.scrollTop = box.parentElement.scrollHeight;
}

function page(start) {
  state.viewStart = start;
  renderSession();
  $("messages").focus();
}

function overlayEl(model, it) {
  const c = it.compaction;
  const open = state.expanded.has(c.id);
  return h(
    "section",
    { class: "overlay", "data-compaction": c.id, "aria-label": `Compaction of ${it.end - it.start + 1} messages` },
    h(
      "div",
      { class: "o-head" },
      `Compaction: ${it.end - it.start + 1} messages summarized (${short(c.from_message_id)} → ${short(c.to_message_id)})`,
      h(
        "button",
        {
          type: "button",
          "aria-expanded": open ? "true" : "false",
          onclick: () => {
            if (open) state.expanded.delete(c.id);
            else state.expanded.add(c.id);
            renderSession();
          },
        },
        open ? "Hide originals" : "Show originals",
      ),
    ),
    h("div", { class: "part text", text: c.summary }),
  );
}

function messageEl(model, id, overlay) {
  const node = model.nodes.get(id);
  const msg = node.msg;
  const status = streamStatus.get(id);
  const siblings = model.siblingsOf(node);
  const el = h(
    "article",
    {
      class: `message${overlay ? " in-overlay" : ""}${status === "streaming" ? " streaming" : ""}`,
      "data-id": id,
      "data-role": msg.role,
      tabindex: "-1",
      "aria-label": `${msg.role} message ${id}`,
      "aria-busy": status === "streaming" ? "true" : null,
    },
    h(
      "div",
      { class: "m-head" },
      h("span", { class: "m-role", text: msg.role }),
      h("code", { text: id }),
      h("span", { text: fmtTime(msg.createdAt) }),
      status ? h("span", { class: "badge", text: status }) : null,
      siblings.length > 1 ? branchSwitch(model, siblings, id) : null,
    ),
    ...(msg.parts ?? []).map(partEl),
  );
  return el;
}

function branchSwitch(model, siblings, id) {
  const k = siblings.indexOf(id);
  const go = (j) => () => {
    state.pinnedLeaf = model.newestUnder(siblings[j]);
    state.viewStart = null;
    renderSession();
  };
  return h(
    "span",
    { class: "m-branch" },
    h("button", { type: "button", disabled: k === 0, "aria-label": "Previous branch", onclick: go(k - 1) }, "◀"),
    h("span", { text: `branch ${k + 1} of ${siblings.length}` }),
    h("button", { type: "button", disabled: k === siblings.length - 1, "aria-label": "Next branch", onclick: go(k + 1) }, "▶"),
  );
}

function rerenderMessage(id) {
  const old = $("messages").querySelector(`article[data-id="${CSS.escape(id)}"]`);
  const model = state.current;
  if (!old || !model?.nodes.has(id)) return;
  const fresh = messageEl(model, id, old.classList.contains("in-overlay"));
  if (old.classList.contains("highlight")) fresh.classList.add("highlight");
  old.replaceWith(fresh);
  const scroller = $("messages").parentElement;
  if (state.viewStart === null && scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 200) scroller.scrollTop = scroller.scrollHeight;
}

function partEl(part) {
  const type = String(part?.type ?? "");
  if (type === "text") return h("div", { class: "part text", text: part.text ?? "" });
  if (type === "reasoning") return h("details", { class: "part reasoning", open: true }, h("summary", { text: "Reasoning" }), h("div", { text: part.text ?? "" }));
  if (type.startsWith("tool-") || type === "dynamic-tool") {
    const name = type === "dynamic-tool" ? part.toolName : type.slice(5);
    return h(
      "section",
      { class: "part tool", "aria-label": `Tool call ${name}` },
      h("h4", { text: `Tool call: ${name} · ${part.state ?? ""}${part.toolCallId ? ` · ${part.toolCallId}` : ""}` }),
      part.input !== undefined ? [h("div", { text: "Input" }), h("pre", { text: json(part.input) })] : null,
      part.output !== undefined ? [h("div", { text: "Output" }), h("pre", { text: json(part.output) })] : null,
      part.errorText ? [h("div", { text: "Error" }), h("pre", { text: part.errorText })] : null,
    );
  }
  if (type === "file") {
    const url = typeof part.url === "string" ? part.url : "";
    const safe = /^(https?:|data:)/i.test(url);
    const label = `${part.filename ?? "file"} (${part.mediaType ?? "unknown type"})`;
    return h(
      "div",
      { class: "part file" },
      `File: ${label} `,
      safe && /^data:image\//i.test(url) && !/svg/i.test(url) ? h("img", { src: url, alt: part.filename ?? "attached image" }) : null,
      safe ? h("a", { href: url, target: "_blank", rel: "noopener noreferrer", text: "open" }) : null,
    );
  }
  if (type === "step-start") return h("hr", { class: "part step", "aria-label": "step" });
  return h("details", { class: "part other" }, h("summary", { text: type || "part" }), h("pre", { text: json(part) }));
}

function renderPresence() {
  $("presence").replaceChildren(
    ...[...state.presence.values()].map((e) => h("li", { "data-connection": e.connection_id }, h("strong", { text: e.name ?? "(anonymous)" }), ` ${e.role ?? ""} · ${e.connection_id}`)),
  );
  if (!state.presence.size) $("presence").replaceChildren(h("li", { class: "hint", text: "Nobody" }));
}

function renderContext() {
  $("context").replaceChildren(
    ...state.blocks.map((b) => {
      const pct = b.max_tokens ? Math.min(100, Math.round((100 * b.tokens) / b.max_tokens)) : null;
      return h(
        "li",
        { "data-label": b.label },
        h("strong", { text: b.label }),
        ` ${fmtInt(b.tokens)}${b.max_tokens ? ` / ${fmtInt(b.max_tokens)}` : ""} tokens${b.writable ? "" : " · read-only"}${b.is_skill ? " · skill" : ""}`,
        pct === null
          ? null
          : h(
              "div",
              { class: `bar${pct >= 90 ? " full" : ""}`, role: "meter", "aria-valuemin": 0, "aria-valuemax": b.max_tokens, "aria-valuenow": b.tokens, "aria-label": `${b.label} usage` },
              h("span", { style: `width:${pct}%` }),
            ),
        h("details", {}, h("summary", { text: "Content" }), h("pre", { text: b.content })),
      );
    }),
  );
  if (!state.blocks.length) $("context").replaceChildren(h("li", { class: "hint", text: "No context blocks" }));
}

function renderPrompt(model) {
  $("prompt-summary").textContent = model.prompt === null ? "Not frozen yet" : `Frozen (${fmtInt(model.prompt.length)} characters)`;
  $("prompt").textContent = model.prompt ?? "";
}

function eventSummary(ev) {
  const d = ev.data ?? {};
  if (d.message) return `${d.message.role} ${d.message.id}${d.parent_id ? ` ← ${d.parent_id}` : ""}`;
  if (d.ids) return d.ids.join(", ");
  if (d.compaction) return `${d.compaction.from_message_id} → ${d.compaction.to_message_id}`;
  if (d.label) return d.label;
  if (d.message_id) return `${d.message_id} ${d.status ?? ""}`;
  if (d.session) return d.session.name;
  return "";
}

function renderLog(model) {
  const shown = model.events.slice(-LOG_SHOW);
  const log = $("log");
  const scroller = log.closest("aside");
  const stick = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 40;
  log.replaceChildren(...shown.map((ev) => h("li", { "data-seq": ev.seq }, h("span", { class: "seq", text: `#${ev.seq}` }), ` ${ev.type} `, eventSummary(ev))));
  if (stick) scroller.scrollTop = scroller.scrollHeight;
}

// -- wiring ---------------------------------------------------------------------------------
function init() {
  const wanted = readHash();
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const value = $("token-input").value.trim();
    $("token-input").value = "";
    if (value) sessionStorage.setItem("sessionhub.token", value);
    $("token-form").hidden = true;
    notice("");
    restart();
  });
  $("change-token").addEventListener("click", () => askToken("Enter another access token."));
  $("search-form").addEventListener("submit", (e) => {
    e.preventDefault();
    search($("search-input").value);
  });
  $("open-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const id = $("open-input").value.trim();
    if (id) openSession(id);
  });
  listboxKeys($("sessions"), (id) => openSession(id));
  listboxKeys($("leaves"), (id) => pickLeaf(id));
  start();
  renderPresence();
  renderContext();
  if (wanted.session) openSession(wanted.session, wanted.message);
}

init();
