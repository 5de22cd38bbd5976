// LiveMessages: streamed messages as a reader sees them, and applyDelta, the rule that grows a
// message's parts by one delta (protocol/deltas.py's).

import { HubError } from "./errors.js";

/**
 * Messages being streamed, as a reader sees them: feed every stream frame to apply(); it
 * returns the message as it stands. Deltas apply once each, in index order; a delta that
 * arrives before the state it follows waits for it. applyEvent() takes the logged
 * message.updated / stream.ended events (a stream that ended while the client was away).
 */
export class LiveMessages {
  constructor() {
    this.messages = new Map();
    this.index = new Map();
    this.status = new Map();
    this.early = new Map();
  }

  apply(frame) {
    const mid = frame.message_id;
    if (["start", "state", "end"].includes(frame.action) && frame.message) {
      if (!(frame.action === "state" && (this.index.get(mid) ?? -1) >= frame.index)) {
        this.messages.set(mid, { ...frame.message, parts: (frame.message.parts ?? []).map((p) => ({ ...p })) });
        this.index.set(mid, frame.index);
        // A message held without an end is "streaming" (the Python client agrees).
        if (frame.status) this.status.set(mid, frame.status);
        else if (frame.action !== "end") this.status.set(mid, "streaming");
      }
    } else if (frame.action === "delta") {
      if (!this.early.has(mid)) this.early.set(mid, new Map());
      for (const d of frame.deltas ?? []) this.early.get(mid).set(Number(d.index), d);
    }
    const early = this.early.get(mid) ?? new Map();
    while (this.index.has(mid) && early.has(this.index.get(mid) + 1)) {
      const next = this.index.get(mid) + 1;
      LiveMessages.applyDelta(this.messages.get(mid), early.get(next));
      early.delete(next);
      this.index.set(mid, next);
    }
    for (const i of [...early.keys()]) if (i <= (this.index.get(mid) ?? -1)) early.delete(i);
    return this.messages.get(mid) ?? null;
  }

  applyEvent(event) {
    if (event.type === "message.updated") {
      const m = event.data?.message;
      if (m && this.index.has(m.id)) {
        this.messages.set(m.id, { ...m, parts: (m.parts ?? []).map((p) => ({ ...p })) });
        return this.messages.get(m.id);
      }
    } else if (event.type === "stream.ended") {
      const mid = String(event.data?.message_id);
      if (this.index.has(mid)) {
        this.status.set(mid, String(event.data.status));
        this.index.set(mid, Math.max(this.index.get(mid), Number(event.data.deltas ?? 0)));
        this.early.delete(mid);
        return this.messages.get(mid);
      }
    }
    return null;
  }

  /** One delta onto a message; one that is not valid is skipped (the hub validated them). */
  static applyDelta(message, delta) {
    try {
      applyDelta((message.parts ??= []), delta.kind, delta.text, delta.part);
    } catch (err) {
      if (!(err instanceof HubError)) throw err;
    }
  }
}

/**
 * Grow `parts` by one delta, the rule of protocol/deltas.py: text and reasoning extend the
 * last part of their kind; a tool part replaces the part with its toolCallId (or is added);
 * `part` appends any other part (a data part with an id replaces its namesake), `reset`
 * drops the current step's parts, `await` changes nothing.
 * A delta that is none of these throws HubError("invalid") and changes nothing.
 */
export function applyDelta(parts, kind, text, part) {
  if (kind === "await") return; // the writer waits for the user: nothing changes
  if (kind === "reset") {
    // The SDK's reset-step: the parts after the last step-start go.
    let start = parts.length - 1;
    while (start >= 0 && parts[start].type !== "step-start") start--;
    parts.splice(start + 1);
    return;
  }
  if (kind === "part") {
    const type = part !== null && typeof part === "object" && !Array.isArray(part) ? part.type : undefined;
    if (typeof type !== "string" || type === "text" || type === "reasoning" || type === "dynamic-tool" || type.startsWith("tool-")) {
      throw new HubError("invalid", "a part delta needs a `part` whose type is not text, reasoning or a tool (those have their own kinds)");
    }
    if (type.startsWith("data-") && part.id != null) {
      const at = parts.findIndex((p) => p.type === type && p.id === part.id);
      if (at >= 0) {
        parts[at] = { ...part };
        return;
      }
    }
    parts.push({ ...part });
    return;
  }
  if (kind === "text" || kind === "reasoning") {
    if (typeof text !== "string") throw new HubError("invalid", `a ${kind} delta needs \`text\``);
    const last = parts[parts.length - 1];
    if (last && last.type === kind && typeof last.text === "string") last.text += text;
    else parts.push({ type: kind, text });
    return;
  }
  const tool = part !== null && typeof part === "object" && !Array.isArray(part) ? part.type : undefined;
  if (typeof tool !== "string" || !(tool.startsWith("tool-") || tool === "dynamic-tool")) {
    throw new HubError("invalid", "a tool delta needs a `part` of type `tool-<name>` or `dynamic-tool`");
  }
  const callId = part.toolCallId ?? null;
  const i = callId === null ? -1 : parts.findIndex((p) => p.toolCallId === callId);
  if (i >= 0) parts[i] = { ...part };
  else parts.push({ ...part });
}

