// Acting on a session, through the JS client: each action is an ordinary request, so its
// effect reaches this page (and every other subscriber) as logged events. Shown only when
// the token's scopes allow them (read from the token's payload; the hub decides anyway).
import { activeLeaf, hooks, state, token } from "./model.js";
import { $, allows, h } from "./util.js";

function newId() {
  const bytes = new Uint8Array(8);
  crypto.getRandomValues(bytes);
  return `u-${[...bytes].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
}

function say(text, bad = false) {
  const el = $("action-status");
  el.textContent = text;
  el.className = bad ? "bad" : "";
}

function failed(what, err) {
  say(`${what} failed: ${err.code ?? "error"}: ${err.message}`, true);
}

let cursorOf = () => null; // the tree's selected message, set by main.js

export function initActions(getCursor) {
  cursorOf = getCursor;
  $("composer").addEventListener("submit", async (e) => {
    e.preventDefault();
    const model = state.current;
    const input = $("composer-text");
    const body = input.value.trim();
    if (!model || !body) return;
    const leaf = activeLeaf(model);
    const sibling = $("composer-sibling").checked && leaf;
    const parent = sibling ? model.nodes.get(leaf).parentId : (leaf ?? null);
    const message = { id: newId(), role: "user", parts: [{ type: "text", text: body }] };
    try {
      await state.client.request("append", { session_id: model.id, message, parent_id: parent });
      input.value = "";
      state.pinnedLeaf = null; // the new message is the latest leaf: follow it
      state.viewStart = null;
      state.follow = true;
      say(sibling ? "Sent as a sibling of the active message." : "Sent.");
    } catch (err) {
      failed("Sending", err); // the text stays in the box: nothing is lost
    }
  });
  $("act-regenerate").addEventListener("click", async () => {
    const model = state.current;
    try {
      // leaf_id: the hub's alias of message_id (an assistant leaf is regenerated as a sibling).
      await state.client.request("start_turn", { session_id: model.id, leaf_id: activeLeaf(model) });
      say("Turn started: a responder will stream the reply.");
    } catch (err) {
      say(`The turn did not start (${err.code}: ${err.message}). Nothing was appended.`, true);
    }
  });
  $("act-rename").addEventListener("click", () => {
    const form = $("rename-form");
    form.hidden = !form.hidden;
    if (!form.hidden) {
      $("rename-input").value = state.sessions.get(state.current.id)?.name ?? "";
      $("rename-input").focus();
    }
  });
  $("rename-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const name = $("rename-input").value.trim();
    if (!name) return;
    try {
      await state.client.request("rename", { session_id: state.current.id, name });
      $("rename-form").hidden = true;
      say(`Renamed to “${name}”.`);
    } catch (err) {
      failed("Renaming", err);
    }
  });
  $("act-fork").addEventListener("click", async () => {
    const model = state.current;
    const at = cursorOf() ?? activeLeaf(model);
    if (!at) return say("Nothing to fork: the session has no messages.", true);
    const name = `${state.sessions.get(model.id)?.name ?? model.id} (fork)`;
    try {
      const info = await state.client.request("fork", { session_id: model.id, at_message_id: at, name });
      say(`Forked at ${at}: `);
      $("action-status").append(h("a", { href: `#session=${encodeURIComponent(info.id)}`, onclick: (ev) => (ev.preventDefault(), hooks.open(info.id)), text: `open “${info.name}”` }));
    } catch (err) {
      failed("Forking", err);
    }
  });
  $("act-compact").addEventListener("click", async () => {
    const model = state.current;
    say("Compacting…");
    try {
      const result = await state.client.request("compact", { session_id: model.id, leaf_id: activeLeaf(model) });
      // A failed summarizer is not an error reply: it is an `error` event in the log.
      say(
        result
          ? `Compacted ${result.from_message_id} → ${result.to_message_id}.`
          : "Nothing was compacted: the branch has nothing between its first messages and the newest ones the tail keeps " +
              "(a summary needs a longer history); a failed summarizer shows as an error event in the log.",
        !result,
      );
    } catch (err) {
      failed("Compacting", err);
    }
  });
  $("act-end").addEventListener("click", () => {
    $("delete-confirm").hidden = true;
    $("end-confirm").hidden = false;
    $("end-name").textContent = state.sessions.get(state.current.id)?.name ?? state.current.id;
    $("end-reason").value = "";
    $("end-reason").focus();
  });
  $("end-no").addEventListener("click", () => {
    $("end-confirm").hidden = true;
    $("act-end").focus();
  });
  $("end-confirm").addEventListener("submit", async (e) => {
    e.preventDefault();
    // Blank: the hub's default reason ("ended"); it refuses more than 200 characters.
    const reason = $("end-reason").value.trim();
    try {
      const info = await state.client.request("end", { session_id: state.current.id, ...(reason ? { reason } : {}) });
      $("end-confirm").hidden = true;
      say(`Ended (${info.end_reason}).`);
    } catch (err) {
      failed("Ending", err); // e.g. conflict: another user ended it first
    }
  });
  $("act-delete").addEventListener("click", () => {
    $("end-confirm").hidden = true;
    $("delete-confirm").hidden = false;
    $("delete-name").textContent = state.sessions.get(state.current.id)?.name ?? state.current.id;
    $("delete-yes").focus();
  });
  $("delete-no").addEventListener("click", () => {
    $("delete-confirm").hidden = true;
    $("act-delete").focus();
  });
  $("delete-yes").addEventListener("click", async () => {
    const id = state.current.id;
    try {
      await state.client.request("delete", { session_id: id });
      $("delete-confirm").hidden = true;
      say("Deleted.");
    } catch (err) {
      failed("Deleting", err);
    }
  });
}

/** Show what the token allows on this session. */
export function renderActions(model) {
  const t = token();
  const write = allows(t, "write", model.id);
  const admin = allows(t, "admin", model.id);
  const info = state.sessions.get(model.id);
  $("composer").hidden = !write;
  $("act-regenerate").hidden = !write;
  // Offered only where it can run: /healthz says whether the hub has a summarizer.
  $("act-compact").hidden = !write || state.canCompact === false;
  for (const id of ["act-rename", "act-fork", "act-delete"]) $(id).hidden = !admin;
  // Ending an ended session is refused (conflict): the button goes once it has ended.
  $("act-end").hidden = !admin || !!info?.end_reason;
  if (!admin) {
    $("rename-form").hidden = true;
    $("delete-confirm").hidden = true;
  }
  if ($("act-end").hidden) $("end-confirm").hidden = true;
  $("actions").dataset.level = admin ? "admin" : write ? "write" : "read";
  $("actions-note").textContent = !write ? "Your token allows reading this session only: no actions." : !admin ? "Renaming, forking, ending and deleting need admin on this session." : "";
  $("composer-sibling").disabled = !model.latest;
  if (info?.end_reason) $("actions-note").textContent += ` This session ended (${info.end_reason}).`;
}
