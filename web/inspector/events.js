// The event log: newest events of the session, each row opening to its data (JSON), errors
// highlighted, filtered by type.
import { $, h, json, timeEl } from "./util.js";

const SHOW = 200;
const open = new Set(); // seqs whose details are open
let filter = "";
let knownTypes = "";

/** A row is an error: an `error` event, a `status` carrying one, a stream that did not finish. */
export function isError(ev) {
  const d = ev.data ?? {};
  return ev.type === "error" || d.error !== undefined || (ev.type === "stream.ended" && d.status !== "finished");
}

/**
 * Turn id -> the line shown for the turns ended `refused` in these events: a start that lost
 * a race to another node's turn (hub/server/remoteturns.py REFUSED), or that could not check
 * for one. Such a turn never ran and its start was answered with an error, so its
 * `turn.started` / `turn.ended` pair is no failed turn.
 */
export function refusedTurns(events) {
  const out = new Map();
  for (const ev of events) {
    const d = ev.data ?? {};
    if (ev.type === "turn.ended" && d.refused === true && typeof d.turn_id === "string") {
      out.set(d.turn_id, `refused, never ran${d.error !== undefined ? `: ${d.error}` : ""}`);
    }
  }
  return out;
}

const isTurn = (ev) => ev.type === "turn.started" || ev.type === "turn.ended";

function summary(ev) {
  const d = ev.data ?? {};
  if (d.error !== undefined) return String(d.error);
  if (d.message) return `${d.message.role} ${d.message.id}${d.parent_id ? ` ← ${d.parent_id}` : ""}`;
  if (d.ids) return d.ids.join(", ");
  if (d.compaction) return `${d.compaction.from_message_id} → ${d.compaction.to_message_id}`;
  if (d.phase) return `${d.phase}${d.token_estimate !== undefined ? ` · ~${d.token_estimate} tokens` : ""}`;
  if (d.label) return d.label;
  if (d.message_id) return `${d.message_id} ${d.status ?? ""}`;
  if (d.session) return d.session.name;
  return "";
}

export function initLog(onChange) {
  $("log-filter").addEventListener("change", (e) => {
    filter = e.target.value;
    onChange();
  });
  $("log").addEventListener("toggle", (e) => {
    const seq = e.target.closest?.("li")?.dataset.seq;
    if (!seq) return;
    if (e.target.open) {
      open.add(seq);
      fill(e.target);
    } else open.delete(seq);
  }, true);
}

const eventOf = new WeakMap(); // <details> -> its event: the JSON is written when opened
function fill(details) {
  const pre = details.querySelector(".ev-data");
  if (pre && !pre.textContent) pre.textContent = json(eventOf.get(details)?.data ?? {});
}

export function resetLog() {
  open.clear();
  filter = "";
  knownTypes = "";
  $("log-filter").value = "";
}

export function renderLog(model) {
  const types = [...new Set(model.events.map((e) => e.type))].sort();
  if (types.join() !== knownTypes) {
    knownTypes = types.join();
    const select = $("log-filter");
    select.replaceChildren(h("option", { value: "", text: "All types" }), ...types.map((t) => h("option", { value: t, text: t })));
    select.value = types.includes(filter) ? filter : "";
    filter = select.value;
  }
  const matching = filter ? model.events.filter((e) => e.type === filter) : model.events;
  const shown = matching.slice(-SHOW);
  const refused = refusedTurns(model.events);
  $("log-count").textContent = matching.length > shown.length ? `newest ${shown.length} of ${matching.length}` : `${matching.length}`;
  const log = $("log");
  const scroller = log.closest(".log-box");
  const stick = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 40;
  log.replaceChildren(
    ...shown.map((ev) => {
      const seq = String(ev.seq);
      // Both rows of a refused pair are muted: the turn.started comes before its refusal.
      const muted = isTurn(ev) && refused.has(ev.data?.turn_id);
      const bad = !muted && isError(ev);
      const details = h(
        "details",
        { open: open.has(seq) },
        h("summary", {}, h("span", { class: "seq", text: `#${ev.seq}` }), " ", timeEl(ev.created_at), " ", h("strong", { class: "ev-type", text: ev.type }), " ", h("span", { class: "ev-sum", text: muted ? refused.get(ev.data.turn_id) : summary(ev) })),
        h("pre", { class: "ev-data" }),
      );
      eventOf.set(details, ev);
      if (details.open) fill(details);
      return h("li", { "data-seq": seq, "data-type": ev.type, class: bad ? "error" : muted ? "refused" : null }, details);
    }),
  );
  if (stick) scroller.scrollTop = scroller.scrollHeight;
}
