// The views: sessions list, session header, branches, messages, presence, context, prompt.
import { renderActions } from "./actions.js";
import { renderLog } from "./events.js";
import { filePartEl } from "./files.js";
import { activeLeaf, hooks, state, token } from "./model.js";
import { $, allows, fmtCost, fmtInt, h, json, plural, short, textOf, timeEl } from "./util.js";

export const PAGE = 100; // items rendered at once: a 10,000-message branch is paged, never all in the DOM
export const scroller = () => $("session");

let tree = null;
export function setTree(view) {
  tree = view;
}

// -- scheduling: one full render per frame, or only the messages that grew -------------------
let queued = false;
let full = false;
let dirty = new Set();
export function scheduleRender(onlyMessage = null) {
  if (onlyMessage) dirty.add(onlyMessage);
  else full = true;
  if (queued) return;
  queued = true;
  requestAnimationFrame(() => {
    queued = false;
    const wasFull = full;
    const ids = dirty;
    full = false;
    dirty = new Set();
    if (wasFull) renderSession();
    else for (const id of ids) rerenderMessage(id);
  });
}

// -- the sessions list ----------------------------------------------------------------------
export function renderSessions() {
  const list = [...state.sessions.values()].sort((a, b) => String(b.updated_at).localeCompare(String(a.updated_at)));
  $("session-count").textContent = `(${list.length})`;
  const ul = $("sessions");
  const focused = document.activeElement?.closest?.("#sessions li")?.dataset.id;
  ul.replaceChildren(
    ...list.map((s) => {
      const selected = state.current?.id === s.id;
      return h(
        "li",
        { role: "option", "aria-selected": selected ? "true" : "false", "data-id": s.id, tabindex: "-1" },
        h("span", { class: "s-name", text: s.name || "(unnamed)" }),
        h(
          "span",
          { class: "s-meta" },
          `${short(s.id)} · ${fmtInt(s.input_tokens)}/${fmtInt(s.output_tokens)} tok · ${fmtCost(s.estimated_cost)}`,
          s.parent_session_id ? h("span", { class: "badge", text: "fork" }) : null,
          s.end_reason ? h("span", { class: "badge ended", text: `ended: ${s.end_reason}` }) : null,
        ),
        h("span", { class: "s-time" }, "active ", timeEl(s.updated_at, "last activity")),
      );
    }),
  );
  if (focused) ul.querySelector(`li[data-id="${CSS.escape(focused)}"]`)?.focus();
  // An empty list says how to fill it (once the list is known: not while connecting).
  $("sessions-hint").hidden = list.length > 0 || !state.sessionsLoaded;
}

// -- one session ----------------------------------------------------------------------------
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

function metaValue(key, value) {
  if (key === "forked from") {
    const parent = state.sessions.get(value);
    return h("a", { href: `#session=${encodeURIComponent(value)}`, onclick: (e) => (e.preventDefault(), hooks.open(value)), text: parent?.name ? `${parent.name} (${short(value)})` : value });
  }
  if (key === "last activity" || key === "created") return timeEl(value, key);
  return String(value);
}

export function renderSession() {
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
    ["created", info?.created_at],
    ["last activity", info?.updated_at],
    ["seq", model.lastSeq],
  ].filter(([, v]) => v !== null && v !== undefined && v !== "");
  $("session-meta").replaceChildren(...meta.map(([k, v]) => h("div", {}, h("dt", { text: k }), h("dd", {}, metaValue(k, v)))));
  const view = $("session-view");
  view.dataset.caughtUp = String(model.caughtUp);
  view.dataset.messages = String(model.nodes.size);
  const status = $("session-status");
  if (!model.caughtUp && model.readySeq !== null) {
    // Catching up on a long log: the rest is drawn once, when it is read.
    status.textContent = `Loading the event log… ${fmtInt(model.lastSeq)} / ${fmtInt(model.readySeq)}`;
    return;
  }
  if (model.note) status.textContent = model.note;
  else if (!status.dataset.sticky) status.textContent = "";

  // Navigating to a message (search hit, tree): pick a branch through it, page to it, expand its overlay.
  const focus = state.pendingFocus && model.caughtUp && model.nodes.has(state.pendingFocus) ? state.pendingFocus : null;
  if (focus && !model.path(activeLeaf(model)).includes(focus)) state.pinnedLeaf = model.newestUnder(focus);
  const leaf = activeLeaf(model);
  const pathIds = leaf ? model.path(leaf) : [];
  if (focus) {
    const at = pathIds.indexOf(focus);
    for (const o of model.overlays(pathIds)) if (at >= o.start && at <= o.end) state.expanded.add(o.compaction.id);
  }
  const items = itemsOf(model, pathIds);
  if (focus) {
    const at = items.findIndex((it) => it.kind === "msg" && it.id === focus);
    state.viewStart = at + PAGE / 2 >= items.length ? null : Math.max(0, at - PAGE / 2);
  }
  tree?.update(model, pathIds, leaf);
  renderLeaves(model, leaf);
  renderMessages(model, items, pathIds.length);
  renderActions(model);
  renderPrompt(model);
  renderLog(model);
  if (focus) {
    state.pendingFocus = null;
    const el = $("messages").querySelector(`[data-id="${CSS.escape(focus)}"]`);
    if (el) {
      el.classList.add("highlight");
      el.scrollIntoView({ block: "center" });
      el.focus({ preventScroll: true });
      state.follow = false;
    }
  }
}

function leafPreview(n) {
  return textOf(n.msg).slice(-60) || n.msg.parts?.[0]?.type || (state.streamStatus.get(n.id) === "streaming" ? "(streaming…)" : "(empty)");
}

function renderLeaves(model, leaf) {
  const all = model.leaves();
  const leaves = all.slice(0, 200);
  const lay = tree?.lay;
  $("leaf-count").textContent = `(${plural(all.length, "leaf", "leaves")})`;
  const focused = document.activeElement?.closest?.("#leaves li")?.dataset.id;
  $("leaves").replaceChildren(
    ...leaves.map((n) => {
      const depth = lay?.pos.get(n.id) ? lay.pos.get(n.id).row + 1 : model.path(n.id).length;
      return h(
        "li",
        { role: "option", tabindex: "-1", "data-id": n.id, "aria-selected": n.id === leaf ? "true" : "false", onclick: () => pickLeaf(n.id) },
        h("strong", { text: `${n.msg.role} ${short(n.id)}` }),
        ` · depth ${fmtInt(depth)}${n.id === model.latest ? " · latest" : ""} · `,
        timeEl(n.msg.createdAt ?? n.storedAt),
        " · ",
        h("span", { class: "leaf-preview", text: leafPreview(n) }),
      );
    }),
  );
  if (focused) $("leaves").querySelector(`li[data-id="${CSS.escape(focused)}"]`)?.focus();
}

export function pickLeaf(id) {
  const model = state.current;
  state.pinnedLeaf = id === model.latest ? null : id;
  state.viewStart = null;
  state.follow = true;
  renderSession();
}

function renderMessages(model, items, pathLength) {
  const box = $("messages");
  const n = items.length;
  const s = state.viewStart === null ? Math.max(0, n - PAGE) : Math.min(state.viewStart, Math.max(0, n - PAGE));
  const e = Math.min(n, s + PAGE);
  const els = [];
  for (let i = s; i < e; i++) {
    const it = items[i];
    els.push(it.kind === "overlay" ? overlayEl(model, it) : messageEl(model, it.id, it.overlay));
  }
  if (!n) els.push(h("p", { class: "hint", text: "No messages yet." }));
  box.replaceChildren(...els);
  box.dataset.pathLength = String(pathLength);
  // A branch that fits one page has no pager.
  for (const pager of [$("pager-top"), $("pager-bottom")]) {
    pager.hidden = n <= PAGE;
    if (n <= PAGE) continue;
    pager.replaceChildren(
      h("button", { type: "button", disabled: s === 0, onclick: () => page(Math.max(0, s - PAGE)) }, "◀ Earlier"),
      h("span", { text: `Items ${fmtInt(s + 1)}–${fmtInt(e)} of ${fmtInt(n)} (${plural(pathLength, "message")} on this branch)` }),
      h("button", { type: "button", disabled: e >= n, onclick: () => page(s + PAGE) }, "Later ▶"),
      h("button", { type: "button", disabled: state.viewStart === null, onclick: () => page(null) }, "Latest"),
    );
  }
  followEnd();
}

/** Keep the end in view while following (the user did not scroll away). */
export function followEnd() {
  const el = scroller();
  if (state.follow && state.viewStart === null && !state.pendingFocus) el.scrollTop = el.scrollHeight;
  $("follow").hidden = state.follow || state.viewStart !== null;
}

function page(start) {
  state.viewStart = start;
  state.follow = start === null;
  renderSession();
  $("messages").focus();
}

function overlayEl(model, it) {
  const c = it.compaction;
  const open = state.expanded.has(c.id);
  const count = it.end - it.start + 1;
  return h(
    "section",
    { class: "overlay", "data-compaction": c.id, "aria-label": `Compaction of ${plural(count, "message")}` },
    h(
      "div",
      { class: "o-head" },
      `Compaction: ${plural(count, "message")} summarized (${short(c.from_message_id)} → ${short(c.to_message_id)})`,
      timeEl(c.created_at),
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
  const status = state.streamStatus.get(id);
  const siblings = model.siblingsOf(node);
  return h(
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
      // No createdAt on the message: the time the hub stored it (its message.appended event).
      timeEl(msg.createdAt ?? node.storedAt, msg.createdAt ? "" : "stored"),
      status ? h("span", { class: "badge", text: status }) : null,
      siblings.length > 1 ? branchSwitch(model, siblings, id) : null,
    ),
    ...(msg.parts ?? []).map(partEl),
  );
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
  const model = state.current;
  if (!model?.nodes.has(id)) return;
  const node = model.nodes.get(id);
  const leafLi = $("leaves").querySelector(`li[data-id="${CSS.escape(id)}"] .leaf-preview`);
  if (leafLi) leafLi.textContent = leafPreview(node);
  const old = $("messages").querySelector(`article[data-id="${CSS.escape(id)}"]`);
  if (!old) return;
  const fresh = messageEl(model, id, old.classList.contains("in-overlay"));
  if (old.classList.contains("highlight")) fresh.classList.add("highlight");
  old.replaceWith(fresh);
  followEnd();
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
  if (type === "file") return filePartEl(part);
  if (type === "step-start") return h("hr", { class: "part step", "aria-label": "step" });
  return h("details", { class: "part other" }, h("summary", { text: type || "part" }), h("pre", { text: json(part) }));
}

export function renderPresence() {
  const streaming = new Set([...state.streamStatus].filter(([, s]) => s === "streaming").map(([id]) => id));
  $("presence").replaceChildren(
    ...[...state.presence.values()].map((e) =>
      h(
        "li",
        { "data-connection": e.connection_id, "data-streaming": e.streaming.join(" ") || null },
        h("strong", { text: e.name ?? "(anonymous)" }),
        ` ${e.role ?? ""} · ${short(e.connection_id)}`,
        // What it streams, each id a way to its message (the hub says which connection writes it).
        ...e.streaming.flatMap((id, i) => [i ? ", " : " · streaming ", h("button", { type: "button", class: "p-streaming", "data-message": id, title: `Show ${id}`, onclick: () => hooks.open(state.current.id, id), text: short(id) })]),
      ),
    ),
  );
  if (!state.presence.size) $("presence").replaceChildren(h("li", { class: "hint", text: "Nobody" }));
  $("presence-title").dataset.streaming = String(streaming.size);
}

/** A writable block (not skills, not search) the token may write: edited in place. */
function editable(b) {
  return b.writable && !b.is_skill && !b.is_searchable && state.current && allows(token(), "write", state.current.id);
}

// What the last save of each block said: the block's own context.updated event re-renders
// the list, and the answer must outlive that.
const editSaid = new Map();

function editor(b) {
  const key = `${state.current.id}\u0000${b.label}`;
  const area = h("textarea", { rows: 4, "aria-label": `New content of ${b.label}` });
  area.value = b.content;
  const said = h("span", { class: "edit-status", role: "status", text: editSaid.get(key) ?? "" });
  const save = h("button", { type: "button", text: `Save ${b.label}` });
  const tell = (text) => {
    editSaid.set(key, text);
    said.textContent = text;
  };
  save.addEventListener("click", async () => {
    tell("Saving…");
    try {
      // replace_context_block: max_tokens is enforced by the hub; its refusal is shown as is.
      await state.client.request("replace_context_block", { session_id: state.current.id, label: b.label, content: area.value });
      tell("Saved.");
    } catch (err) {
      tell(`Not saved (${err.code}): ${err.message}`);
    }
  });
  const box = h("details", { class: "edit" }, h("summary", { text: "Edit" }), area, save, said);
  if (editSaid.has(key)) box.open = true;
  return box;
}

export function renderContext() {
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
        editable(b) ? editor(b) : null,
      );
    }),
  );
  if (!state.blocks.length) $("context").replaceChildren(h("li", { class: "hint", text: "No context blocks" }));
}

function renderPrompt(model) {
  $("prompt-summary").textContent = model.prompt === null ? "Not frozen yet" : `Frozen (${plural(model.prompt.length, "character")})`;
  $("prompt").textContent = model.prompt ?? "";
}
