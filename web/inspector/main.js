// The inspector's entry point: wires the model's hooks to the views and the page's controls.
// Modules: model.js (state, the hub client), tree.js (tree view), events.js (event log),
// actions.js (acting on a session), views.js (everything else), util.js (helpers).
import { initActions } from "./actions.js";
import { initLog, resetLog } from "./events.js";
import { forbiddenText, hooks, openSession, restart, start, state, token } from "./model.js";
import { TreeView } from "./tree.js";
import { $, h, refreshTimes, short } from "./util.js";
import { pickLeaf, renderContext, renderPresence, renderSessions, scheduleRender, scroller, setTree } from "./views.js";

function readHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  const t = params.get("token");
  if (t !== null) {
    sessionStorage.setItem("sessionhub.token", t);
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
  }
  return { session: params.get("session"), message: params.get("message") };
}

function setHash(sessionId) {
  history.replaceState(null, "", location.pathname + location.search + (sessionId ? `#session=${encodeURIComponent(sessionId)}` : ""));
}

function notice(text) {
  const el = $("notice");
  el.textContent = text || "";
  el.hidden = !text;
}

function askToken(why) {
  $("token-why").textContent = why;
  $("token-form").hidden = false;
  $("token-input").focus();
}

let lastConn = { state: "connecting" };
function renderConnection(s) {
  if (s) lastConn = s;
  const el = $("conn");
  const { state: st, attempt } = lastConn;
  if (st === "open" && state.tokenRefused) {
    el.dataset.state = "refused";
    el.textContent = "Connected: token refused";
    return;
  }
  el.dataset.state = st;
  el.textContent =
    st === "open" ? "Connected" : st === "reconnecting" ? `Disconnected: reconnecting${attempt > 1 ? ` (attempt ${attempt})` : ""}…` : st === "connecting" ? "Connecting…" : "Disconnected";
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
            { type: "button", class: "hit", "data-session": hit.session_id, "data-message": hit.id, onclick: () => open(hit.session_id, hit.id) },
            h("span", { class: "hit-session", text: `${state.sessions.get(hit.session_id)?.name ?? short(hit.session_id)} · ${hit.role}` }),
            hit.content.length > 140 ? `${hit.content.slice(0, 140)}…` : hit.content,
          ),
        ),
      ),
    );
  } catch (err) {
    status.textContent = err.code === "forbidden" ? forbiddenText("searching across sessions", "read", "*") : `Search failed: ${err.message}`;
  }
}

/** Open a session (and on a narrow screen, close the sessions drawer). */
function open(id, focusMessage = null) {
  const changed = state.current?.id !== id;
  openSession(id, focusMessage);
  if (changed) {
    resetLog();
    $("action-status").textContent = "";
    $("rename-form").hidden = true;
    $("delete-confirm").hidden = true;
    $("end-confirm").hidden = true;
  }
  setHash(id);
  $("empty").hidden = true;
  $("session-view").hidden = false;
  document.body.classList.remove("show-sessions");
  renderSessions();
}

function init() {
  const wanted = readHash();
  const tree = new TreeView($("tree"), $("tree-status"), {
    activate: (id) => {
      // The branch through this message becomes active, and the message list goes to it.
      const model = state.current;
      state.pinnedLeaf = model.newestUnder(id);
      if (state.pinnedLeaf === model.latest) state.pinnedLeaf = null;
      state.pendingFocus = id;
      state.viewStart = null;
      scheduleRender();
    },
  });
  setTree(tree);
  Object.assign(hooks, {
    render: () => scheduleRender(),
    renderMessage: (id) => scheduleRender(id),
    sessions: () => scheduleSessions(),
    presence: renderPresence,
    context: renderContext,
    sessionsNote: (text, warn, showOpen = false) => {
      $("sessions-note").textContent = text;
      $("sessions-note").className = warn ? "warn" : "";
      if (showOpen) $("open-form").hidden = false;
    },
    sessionStatus: (text) => {
      $("session-status").textContent = text;
      $("session-status").dataset.sticky = "1";
    },
    notice,
    askToken,
    connection: renderConnection,
    open: (id, focusMessage = null) => open(id, focusMessage),
  });
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const value = $("token-input").value.trim();
    $("token-input").value = "";
    if (value) sessionStorage.setItem("sessionhub.token", value);
    $("token-form").hidden = true;
    $("change-token").hidden = !token();
    notice("");
    delete $("session-status").dataset.sticky;
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
    if (id) open(id);
  });
  $("sessions").addEventListener("click", (e) => {
    const id = e.target.closest?.("li[data-id]")?.dataset.id;
    if (id) open(id);
  });
  $("sessions-toggle").addEventListener("click", () => document.body.classList.toggle("show-sessions"));
  $("details-toggle").addEventListener("click", () => document.body.classList.toggle("show-details"));
  $("follow").addEventListener("click", () => {
    state.follow = true;
    state.viewStart = null;
    scheduleRender();
  });
  scroller().addEventListener("scroll", () => {
    // Following stops when the user scrolls away from the end, and resumes back there.
    const el = scroller();
    state.follow = el.scrollHeight - el.scrollTop - el.clientHeight < 60;
    $("follow").hidden = state.follow || state.viewStart !== null;
  }, { passive: true });
  listboxKeys($("sessions"), (id) => open(id));
  listboxKeys($("leaves"), (id) => pickLeaf(id));
  initLog(() => scheduleRender());
  initActions(() => tree.cursor);
  $("change-token").hidden = !token();
  if (!wanted.session) document.body.classList.add("show-sessions");
  start();
  renderPresence();
  renderContext();
  if (wanted.session) open(wanted.session, wanted.message);
  setInterval(() => refreshTimes(), 15000);
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

init();
