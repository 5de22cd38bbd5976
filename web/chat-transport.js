/**
 * The Vercel AI SDK's ChatTransport over the hub's WebSocket: useChat({ id: sessionId,
 * transport: new SessionHubChatTransport({ url, token }) }). A module of its own beside the
 * client it is built on (web/sessionhub.js), so a page that only inspects or writes sessions
 * does not load it. No dependencies; served by the hub at /chat-transport.js.
 */

import { HubClient, LiveMessages } from "./sessionhub.js";

// How far a tool part has come: input, approval asked, approval answered, output (uistream.py's).
const TOOL_STAGE = {
  "input-streaming": 0,
  "input-available": 1,
  "approval-requested": 2,
  "approval-responded": 3,
  "output-available": 4,
  "output-error": 4,
  "output-denied": 4,
};
const isToolPart = (p) => typeof p?.type === "string" && (p.type.startsWith("tool-") || p.type === "dynamic-tool");

/**
 * One streamed message as AI SDK UI message stream chunks: update(message) returns the
 * chunks that take a reader from what it was sent to `message` (text and reasoning grow by
 * their new suffix; tool parts go input-start, input-available, output). A port of
 * hub/adapters/uistream.py's UIMessageEncoder, so both transports send the same chunks.
 */
export class UIMessageChunks {
  constructor(messageId) {
    this.messageId = messageId;
    this.sent = [];
    this.step = false;
    this.metadataSent = false;
  }

  start() {
    return [{ type: "start", messageId: this.messageId }];
  }

  update(message) {
    const chunks = [];
    if (message.metadata != null && !this.metadataSent) {
      this.metadataSent = true;
      chunks.push({ type: "message-metadata", messageMetadata: message.metadata });
    }
    const parts = message.parts ?? [];
    if (parts.length < this.sent.length) {
      // A reset step dropped parts: end what is open, and forget them.
      chunks.push(...this._closeOpen(this.sent.length));
      this.sent.length = parts.length;
    }
    parts.forEach((part, i) => {
      if (i >= this.sent.length) {
        chunks.push(...this._closeOpen(i));
        this.sent.push({});
        chunks.push(...this._first(i, part));
      }
      chunks.push(...this._grow(i, part));
    });
    return chunks;
  }

  close() {
    const chunks = this._closeOpen(this.sent.length);
    if (this.step) {
      this.step = false;
      chunks.push({ type: "finish-step" });
    }
    return chunks;
  }

  _closeOpen(before) {
    const chunks = [];
    for (const sent of this.sent.slice(0, before)) {
      if (sent.open) {
        sent.open = false;
        chunks.push({ type: `${sent.kind}-end`, id: sent.id });
      }
    }
    return chunks;
  }

  _first(i, part) {
    const sent = this.sent[i];
    if (part.type === "text" || part.type === "reasoning") {
      Object.assign(sent, { kind: part.type, id: `${part.type}-${i}`, chars: 0, open: true });
      const chunk = { type: `${part.type}-start`, id: sent.id };
      if (part.providerMetadata != null) chunk.providerMetadata = part.providerMetadata;
      return [chunk];
    }
    if (isToolPart(part)) {
      Object.assign(sent, { kind: "tool", stage: -1 });
      return [];
    }
    sent.kind = "other";
    if (part.type === "step-start") {
      const chunks = this.step ? [{ type: "finish-step" }] : [];
      this.step = true;
      return [...chunks, { type: "start-step" }];
    }
    if (part.type === "file") return [{ type: "file", url: part.url ?? "", mediaType: part.mediaType ?? "" }];
    if (part.type === "source-url" || part.type === "source-document" || String(part.type).startsWith("data-")) {
      return [{ ...part }];
    }
    return [];
  }

  _grow(i, part) {
    const sent = this.sent[i];
    if (sent.kind === "text" || sent.kind === "reasoning") {
      if (typeof part.text !== "string" || part.text.length <= sent.chars) return [];
      const delta = part.text.slice(sent.chars);
      sent.chars = part.text.length;
      return [{ type: `${sent.kind}-delta`, id: sent.id, delta }];
    }
    if (sent.kind !== "tool") return [];
    const dynamic = part.type === "dynamic-tool";
    const common = { toolCallId: String(part.toolCallId ?? ""), toolName: dynamic ? String(part.toolName ?? "") : part.type.slice(5) };
    if (dynamic) common.dynamic = true;
    for (const key of ["providerExecuted", "title"]) if (part[key] != null) common[key] = part[key];
    const stage = TOOL_STAGE[part.state] ?? 0;
    const chunks = [];
    if (sent.stage < 0) {
      chunks.push({ type: "tool-input-start", ...common });
      sent.stage = 0;
    }
    if (stage >= 1 && sent.stage < 1) {
      chunks.push({ type: "tool-input-available", ...common, input: part.input });
      sent.stage = 1;
    }
    const approval = part.approval !== null && typeof part.approval === "object" ? part.approval : {};
    if (stage >= 2 && sent.stage < 2 && approval.id != null) {
      chunks.push({ type: "tool-approval-request", approvalId: String(approval.id), toolCallId: common.toolCallId });
    }
    sent.stage = Math.max(sent.stage, Math.min(stage, 3));
    if (stage >= 4 && sent.stage < 4) {
      if (part.state === "output-denied") {
        chunks.push({ type: "tool-output-denied", toolCallId: common.toolCallId });
      } else if (part.state === "output-error") {
        chunks.push({ type: "tool-output-error", toolCallId: common.toolCallId, errorText: String(part.errorText ?? "") });
      } else {
        chunks.push({ type: "tool-output-available", toolCallId: common.toolCallId, output: part.output });
      }
      sent.stage = 4;
    }
    return chunks;
  }
}

/**
 * The Vercel AI SDK's ChatTransport over the hub's socket: useChat({ id: sessionId,
 * transport: new SessionHubChatTransport({ url, token }) }). sendMessages appends the
 * messages the hub does not hold (a chain from the root, idempotent by id), starts a turn
 * and returns a ReadableStream of UI message chunks; reconnectToStream returns the reply in
 * flight from its start (everything so far, then live) or null. The chat id is a hub session
 * id (create it first: HubClient.request("create", ...)). The socket resumes by itself
 * after a drop, without losing a delta.
 *
 * The SDK's stop() aborts sendMessages' abortSignal: the transport then stops the turn
 * (op stop_turn; the reply is stored as it stood, the responder stops) unless it was made
 * with stopOnAbort: false. A page reload does not abort anything here (the socket just
 * closes), so the reply goes on and the next page resumes it. stopTurn(chatId) stops the
 * chat's turn in flight from anywhere (a resumed stream included).
 */
export class SessionHubChatTransport {
  constructor({ url, token = null, client = null, stopOnAbort = true, ...options } = {}) {
    this.client = client ?? new HubClient(url, { token, name: options.name ?? "chat", role: options.role ?? "user", ...options });
    this.connecting = null;
    this.stopOnAbort = stopOnAbort;
  }

  /** Stop the chat's turn in flight (turn_id: that one); resolves to {turn_id, reply_id, started}. */
  async stopTurn(chatId, turnId = null) {
    await this._connected();
    return this.client.request("stop_turn", { session_id: chatId, turn_id: turnId, reason: "stopped by the user" });
  }

  _connected() {
    if (this.client.socketOpen()) return Promise.resolve();
    if (this.connecting === null) this.connecting = this.client.connect().finally(() => (this.connecting = null));
    return this.connecting;
  }

  async sendMessages({ chatId, messages, trigger = "submit-message", abortSignal } = {}) {
    await this._connected();
    const follow = await this._follow(chatId, abortSignal);
    try {
      if (messages.length) {
        await this.client.request("append_all", { session_id: chatId, messages, parent_id: null });
      }
      const last = messages[messages.length - 1];
      const turn = await this.client.request("start_turn", { session_id: chatId, message_id: last?.id ?? null, trigger });
      if (this.stopOnAbort && abortSignal) {
        // The SDK's stop(): the turn itself stops (an abort before the turn started too).
        const stopIt = () => this.stopTurn(chatId, turn.turn_id).catch(() => {}); // ended already: nothing to stop
        if (abortSignal.aborted) stopIt();
        else abortSignal.addEventListener("abort", stopIt, { once: true });
      }
      return follow.stream(turn);
    } catch (err) {
      follow.stop();
      throw err;
    }
  }

  async reconnectToStream({ chatId, abortSignal } = {}) {
    await this._connected();
    const follow = await this._follow(chatId, abortSignal);
    let turn;
    try {
      turn = await this.client.request("get_turn", { session_id: chatId });
    } catch (err) {
      follow.stop();
      throw err;
    }
    if (!turn) {
      follow.stop();
      return null;
    }
    return follow.stream(turn);
  }

  close() {
    this.client.close();
  }

  /** Follow the session from now on (its stream frames and new events), before asking. */
  async _follow(chatId, abortSignal) {
    const client = this.client;
    const live = new LiveMessages();
    const events = [];
    let wake = () => {};
    let stopped = false;
    let sub = null;
    const offStream = client.on("stream", (frame) => {
      if (frame.session_id !== chatId) return;
      live.apply(frame);
      wake();
    });
    const stop = () => {
      if (stopped) return;
      stopped = true;
      offStream();
      sub?.close().catch(() => {});
      wake();
    };
    await new Promise((resolve, reject) => {
      // From past the end: the hub answers with a reset naming its last seq, and the
      // subscription goes on from there, so no backlog is sent (reload: true).
      sub = client.subscribe(chatId, {
        afterSeq: Number.MAX_SAFE_INTEGER,
        reload: true,
        onReset: () => {},
        onReady: resolve,
        onEvent: (event) => {
          events.push(event);
          wake();
        },
        onError: (err) => {
          reject(err);
          stop();
        },
      });
    });
    abortSignal?.addEventListener("abort", stop, { once: true });
    const stream = (turn) => {
      const chunks = new UIMessageChunks(turn.reply_id);
      return new ReadableStream({
        start: (controller) => {
          controller.enqueue(chunks.start()[0]);
        },
        pull: async (controller) => {
          for (;;) {
            if (stopped) {
              controller.close();
              return;
            }
            const message = live.messages.get(turn.reply_id);
            const out = message ? chunks.update(message) : [];
            const ended = events.find((e) => e.type === "turn.ended" && e.data?.turn_id === turn.turn_id);
            if (ended) {
              const final = live.messages.get(turn.reply_id);
              if (final) out.push(...chunks.update(final));
              out.push(...chunks.close());
              if (ended.data.status === "finished") out.push({ type: "finish", finishReason: "stop" });
              else if (ended.data.status === "stopped") out.push({ type: "abort", reason: ended.data.reason ?? "stopped" });
              else out.push({ type: "error", errorText: ended.data.error ?? "the turn failed" });
              for (const c of out) controller.enqueue(c);
              controller.close();
              stop();
              return;
            }
            if (out.length) {
              for (const c of out) controller.enqueue(c);
              return;
            }
            await new Promise((resolve) => (wake = resolve));
          }
        },
        cancel: stop,
      });
    };
    return { stream, stop };
  }
}

