// The state of the inspector and its wiring to the hub through the JS client. The view is a
// fold of the hub's event logs: the registry stream builds the sessions list, a session's
// stream builds its message tree (message.appended carries each parent), compactions,
// frozen prompt and event log; stream frames grow messages as deltas arrive. After a drop
// the client resubscribes from the last seq, so the view catches up by itself. The token
// never reaches the URL, the console or a log. Rendering is the views' job: they register
// in `hooks`.
import { HubClient, LiveMessages, PresenceList, hubUrlFor } from "../sessionhub.js";
import { allows, tokenClaims } from "./util.js";

export const LOG_KEEP = 2000;

/** What the views provide; model code calls these after changing the state. */
export const hooks = {
  render: () => {}, // the whole session view
  renderMessage: () => {}, // one message (a stream grew)
  sessions: () => {},
  presence: () => {},
  context: () => {},
  sessionsNote: () => {},
  sessionStatus: () => {},
  notice: () => {},
  askToken: () => {},
  connection: () => {},
  open: () => {}, // navigate to a session (the page's hash and panes follow)
};

export const token = () => sessionStorage.getItem("sessionhub.token");

// -- the message tree of one session -------------------------------------------------------
export class SessionModel {
  constructor(id) {
    this.id = id;
    this.reset();
  }

  reset() {
    this.nodes = new Map(); // id -> {id, parentId, children: [], order, msg, time, timeNote}
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

  /** `storedAt`: the time of its message.appended event, shown when the message has no createdAt. */
  add(msg, parentId, storedAt = null) {
    if (!msg || this.nodes.has(msg.id)) return;
    const parent = parentId ? this.nodes.get(parentId) : null;
    const node = { id: msg.id, parentId: parent ? parent.id : null, children: [], order: ++this.order, msg, storedAt };
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
        this.add(d.message, d.parent_id, ev.created_at);
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
        this.structureVersion++;
        return "structure";
      case "prompt.updated":
        this.prompt = d.prompt ?? "";
        return "prompt";
      default:
        return ev.type.startsWith("context.") ? "context" : "log";
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

  /** The overlays that apply on this path (protocol: hub/store/overlays.py `_chosen`). */
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
export const state = {
  client: null,
  sessions: new Map(),
  registrySub: null,
  current: null, // SessionModel
  sessionSub: null,
  pinnedLeaf: null, // null: follow the latest leaf
  viewStart: null, // null: follow the end of the branch
  follow: true, // keep the newest content in view (off once the user scrolls away)
  expanded: new Set(), // compaction ids shown expanded
  pendingFocus: null,
  live: new LiveMessages(),
  streamStatus: new Map(),
  presence: new PresenceList(null), // who is on the current session, and what each streams
  blocks: [],
  tokenRefused: false,
};

export function activeLeaf(model) {
  if (state.pinnedLeaf && model.nodes.has(state.pinnedLeaf)) return state.pinnedLeaf;
  state.pinnedLeaf = null;
  return model.latest;
}

/** The one line saying why a request was refused ("what": a gerund, "listing sessions"). */
export function forbiddenText(what, level, on) {
  if (!token()) return `This hub needs an access token for ${what}.`;
  if (tokenRefused(level, on)) return `The hub refused your token (invalid or expired): ${what} failed.`;
  return `Your token does not allow ${what}: it needs ${level} on ${on}.`;
}

/** A refusal the token's own scopes would allow: the hub refused the token itself. */
function tokenRefused(level, on) {
  const t = token();
  const claims = tokenClaims(t);
  const refused = !claims || allows(t, level, on === "*" ? null : on) || (typeof claims.exp === "number" && claims.exp * 1000 <= Date.now());
  if (refused && !state.tokenRefused) {
    state.tokenRefused = true;
    hooks.connection();
  }
  return refused;
}

// -- connection ---------------------------------------------------------------------------
export function start() {
  state.tokenRefused = false;
  fetch("healthz")
    .then((r) => r.json())
    .then((body) => {
      state.canCompact = body.compaction !== false;
      if (state.current) hooks.render();
    })
    .catch(() => {});
  const client = new HubClient(hubUrlFor(location), { token: token(), name: "inspector", role: "observer", maxBackoff: 2000 });
  state.client = client;
  client.on("state", (s) => {
    if (s.state === "reconnecting" && state.presence.size) {
      state.presence.clear(); // unknown while away; asked again on reconnect
      hooks.presence();
    }
    hooks.connection(s);
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

export function restart() {
  state.registrySub = null;
  state.sessionSub = null;
  state.client?.close();
  state.sessions.clear();
  hooks.sessions();
  const current = state.current?.id;
  state.current = null;
  start();
  if (current) openSession(current);
}

// -- the sessions list ----------------------------------------------------------------------
function followRegistry() {
  state.sessions.clear();
  state.registrySub = state.client.subscribe(null, {
    reload: true,
    onEvent: (ev) => {
      state.sessionsLoaded = true;
      const s = ev.data?.session;
      if (ev.type === "session.deleted") state.sessions.delete(ev.session_id);
      else if (s && s.id) state.sessions.set(s.id, s);
      if (state.current && ev.session_id === state.current.id) hooks.render();
      hooks.sessions();
    },
    onReady: ({ last_seq }) => {
      // Subscribed: with an empty log there is no event to say the (empty) list is known.
      if (!last_seq && !state.sessionsLoaded) {
        state.sessionsLoaded = true;
        hooks.sessions();
      }
    },
    onReset: () => loadSessionList("The registry log was pruned: reloaded the list."),
    onError: (err) => {
      if (err.code === "forbidden") {
        // Not admin on *: a snapshot is the best this token gets, if it may read *.
        // A read token on * is what the README suggests: a note, not a warning.
        loadSessionList(allows(token(), "read", null) ? "The sessions as of now (an admin token on * keeps this list live)." : null, false);
      } else hooks.sessionsNote(`Registry: ${err.message}`, true);
    },
  });
}

/** The session list as of now; `why` says why it is not live (`warn`: as a warning). */
export async function loadSessionList(why, warn = true) {
  try {
    const list = await state.client.request("list");
    state.sessions.clear();
    for (const s of list) state.sessions.set(s.id, s);
    state.sessionsLoaded = true;
    hooks.sessionsNote(why && warn ? `${why} Showing a snapshot.` : why ?? "", warn && !!why);
    hooks.sessions();
  } catch (err) {
    if (err.code === "forbidden") {
      const text = forbiddenText("listing sessions", "read", "*");
      // Said once: in the token form when asking for one, else in the page's notice.
      if (!token()) hooks.askToken(text);
      else hooks.notice(text);
      hooks.sessionsNote("Open a session by its id below.", true, true);
    } else hooks.sessionsNote(`Cannot list sessions: ${err.message}`, true);
  }
}

// -- one session ----------------------------------------------------------------------------
export function openSession(id, focusMessage = null) {
  if (state.current?.id !== id) {
    state.sessionSub?.close();
    state.current = new SessionModel(id);
    state.pinnedLeaf = null;
    state.viewStart = null;
    state.follow = true;
    state.expanded.clear();
    state.presence = new PresenceList(id);
    state.blocks = [];
    state.live = new LiveMessages();
    state.streamStatus = new Map();
    const model = state.current;
    state.sessionSub = state.client.subscribe(id, {
      presence: true,
      reload: true,
      onReady: (r) => {
        if (state.current !== model) return;
        if (model.readySeq === null) model.readySeq = r.last_seq;
        hooks.render();
      },
      onEvent: (ev) => {
        if (state.current !== model) return;
        const changed = model.apply(ev);
        if (ev.type === "message.updated" || ev.type === "stream.ended") state.live.applyEvent(ev);
        if (ev.type === "stream.ended") state.streamStatus.set(ev.data?.message_id, ev.data?.status);
        if (ev.type === "message.appended" && state.live.messages.has(ev.data?.message?.id)) {
          // A stream frame came before the logged append: keep what the deltas built.
          model.nodes.get(ev.data.message.id).msg = state.live.messages.get(ev.data.message.id);
        }
        if (changed === "context") refreshContext();
        const info = ev.data?.session;
        if (ev.type.startsWith("session.") && ev.type !== "session.deleted" && info?.id === id) {
          // Registry changes are in the session's own log too: a token that cannot follow
          // the registry still sees this session end or get renamed (never an older row).
          const known = state.sessions.get(id);
          if (!known || !(info.updated_at < known.updated_at)) state.sessions.set(id, info);
          hooks.sessions();
        }
        if (changed === "structure" && state.pinnedLeaf && ev.type === "message.appended") {
          // A pinned branch that grows keeps following its own tip.
          if (ev.data?.parent_id === state.pinnedLeaf) state.pinnedLeaf = ev.data.message.id;
        }
        if (changed === "message") hooks.renderMessage(ev.data?.message?.id);
        hooks.render();
      },
      onReset: (frame) => snapshot(model, frame),
      onError: (err) => {
        if (state.current !== model) return;
        const text = err.code === "forbidden" ? forbiddenText("reading this session", "read", id) : `Cannot follow this session: ${err.message}`;
        hooks.sessionStatus(text);
        if (err.code === "forbidden") hooks.notice(text);
      },
    });
    refreshPresence();
    refreshContext();
  }
  state.pendingFocus = focusMessage;
  hooks.render();
}

/**
 * The log cannot serve the position (its start was pruned by retention, or the log restarted):
 * rebuild the tree from the hub's messages, which are never pruned. The latest branch comes
 * with overlays collapsed, so the walk starts from the raw root (the first overlay's first
 * message when the branch starts with a summary) and asks each message's children level by
 * level (get_branches): every branch under that root, with the overlays drawn as the log
 * would have.
 */
async function snapshot(model, frame) {
  model.reset();
  model.readySeq = frame.last_seq;
  model.lastSeq = frame.last_seq;
  const pruned = frame.first_seq > 1;
  model.note = pruned ? `Events before seq ${frame.first_seq} were pruned (retention); loading the messages…` : "The event log restarted: reloading the messages…";
  hooks.render();
  const sessionId = model.id;
  const ask = (op, fields = {}) => state.client.request(op, { session_id: sessionId, ...fields });
  try {
    const [history, compactions] = await Promise.all([ask("get_history"), ask("get_compactions")]);
    if (state.current !== model) return;
    model.compactions = compactions;
    let root = history[0] ?? null;
    if (root && compactions.some((c) => `compaction_${c.id}` === root.id)) {
      const first = compactions.find((c) => `compaction_${c.id}` === root.id);
      root = await ask("get_message", { message_id: first.from_message_id });
    }
    if (root) model.add(root, null);
    let level = root ? [root.id] : [];
    while (level.length) {
      const children = await Promise.all(level.map((id) => ask("get_branches", { message_id: id })));
      if (state.current !== model) return;
      const next = [];
      level.forEach((parent, i) => {
        for (const child of children[i]) {
          if (model.nodes.has(child.id)) continue;
          model.add(child, parent);
          next.push(child.id);
        }
      });
      level = next;
    }
    model.structureVersion++;
    model.note = pruned
      ? `Events before seq ${frame.first_seq} were pruned (retention); the messages are all here.`
      : "The event log restarted: the messages are reloaded from the hub.";
  } catch (err) {
    model.note = `Cannot reload the session: ${err.message}`;
  }
  hooks.render();
}

export async function refreshPresence() {
  const model = state.current;
  try {
    const list = await state.client.request("presence", { session_id: model.id });
    if (state.current !== model) return;
    state.presence.reset(list);
  } catch {
    // forbidden or dropped: the session status says so
  }
  hooks.presence();
}

function onPresence(frame) {
  if (state.current && state.presence.apply(frame)) hooks.presence();
}

let contextTimer = null;
export function refreshContext() {
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
    hooks.context();
  }, 50);
}

function onStream(frame) {
  const model = state.current;
  if (!model || frame.session_id !== model.id) return;
  const msg = state.live.apply(frame);
  if (frame.action === "end") state.streamStatus.set(frame.message_id, frame.status);
  else if (frame.action === "start" || frame.action === "state") state.streamStatus.set(frame.message_id, "streaming");
  const node = model.nodes.get(frame.message_id);
  if (node && msg) node.msg = msg;
  hooks.renderMessage(frame.message_id);
}
