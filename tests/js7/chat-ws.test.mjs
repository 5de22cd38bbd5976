// The real AI SDK 7 WebSocketChatTransport (ai 7.x, on Node 22) against a running hub and
// responder: tests/adapters/test_aisdk_ws.py starts both and sets SESSIONHUB_URL and
// SESSIONHUB_WS_URL. The responder answers by the user's text (tests/support/chatkit.py):
// "tool ..." streams reasoning, a tool call and its result, then text; "slow ..." streams
// 40 words over about 1.5 s; anything else is echoed back in three deltas.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { WebSocketChatTransport, readUIMessageStream } from "ai";
import { HubClient } from "../../web/sessionhub.js";

const base = process.env.SESSIONHUB_URL;
const wsUrl = process.env.SESSIONHUB_WS_URL;
const skip = !base ? "needs SESSIONHUB_URL" : false;
const url = `${base.replace(/^http/, "ws")}/api/chat/ws`;

const user = (text) => ({ id: randomUUID(), role: "user", parts: [{ type: "text", text }] });

async function hubRequest(op, fields) {
  const hub = new HubClient(wsUrl);
  await hub.connect();
  try {
    return await hub.request(op, fields);
  } finally {
    hub.close();
  }
}

/** The SDK's message as JSON, minus what it adds for rendering only (as tests/js does). */
function asJson(message) {
  const m = JSON.parse(JSON.stringify(message));
  for (const part of m.parts) {
    if (part.type === "text" || part.type === "reasoning") delete part.state;
    if (part.type === "reasoning" && part.id === `reasoning-${m.parts.indexOf(part)}`) delete part.id;
  }
  return m;
}

async function read(stream) {
  const chunks = [];
  const errors = [];
  const tee = stream.pipeThrough(
    new TransformStream({
      transform(chunk, controller) {
        chunks.push(chunk);
        controller.enqueue(chunk);
      },
    }),
  );
  let last = null;
  for await (const message of readUIMessageStream({ stream: tee, onError: (e) => errors.push(e) })) last = message;
  return { last, chunks, errors };
}

async function until(check, what, ms = 5000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const textOf = (message) => message.parts.filter((p) => p.type === "text").map((p) => p.text).join("");

test("send: the reply streams, and readUIMessageStream gives the message the hub stored", { skip }, async () => {
  const transport = new WebSocketChatTransport({ url });
  try {
    const chatId = randomUUID();
    const first = user("hello there");
    const echo = await read(
      await transport.sendMessages({ chatId, messages: [first], trigger: "submit-message", messageId: undefined }),
    );
    assert.deepEqual(echo.errors, []);
    assert.equal(echo.chunks[0].type, "start");
    assert.equal(echo.chunks.at(-1).type, "finish");
    assert.equal(textOf(echo.last), "You said: hello there");
    assert.deepEqual(asJson(echo.last), await hubRequest("get_message", { session_id: chatId, message_id: echo.last.id }));

    // Reasoning, a tool call through its states, then text, over the same socket.
    const second = user("tool lookup please");
    const tool = await read(
      await transport.sendMessages({ chatId, messages: [first, echo.last, second], trigger: "submit-message" }),
    );
    assert.deepEqual(tool.errors, []);
    const types = tool.chunks.map((c) => c.type);
    for (const t of ["reasoning-start", "tool-input-available", "tool-output-available", "text-delta", "finish"]) {
      assert.ok(types.includes(t), `${t} in ${types}`);
    }
    assert.deepEqual(asJson(tool.last), await hubRequest("get_message", { session_id: chatId, message_id: tool.last.id }));
    const history = await hubRequest("get_history", { session_id: chatId });
    assert.deepEqual(history.map((m) => m.id), [first.id, echo.last.id, second.id, tool.last.id]);
  } finally {
    transport.close();
  }
});

test("two requests at once on one socket each get their own reply", { skip }, async () => {
  const transport = new WebSocketChatTransport({ url });
  try {
    const [a, b] = await Promise.all(
      ["first chat", "second chat"].map(async (text) =>
        read(await transport.sendMessages({ chatId: randomUUID(), messages: [user(text)], trigger: "submit-message" })),
      ),
    );
    assert.equal(textOf(a.last), "You said: first chat");
    assert.equal(textOf(b.last), "You said: second chat");
  } finally {
    transport.close();
  }
});

test("the socket dropped mid-reply: reconnectToStream replays the whole reply once, then live", { skip }, async () => {
  const chatId = randomUUID();
  const first = new WebSocketChatTransport({ url });
  const stream = await first.sendMessages({ chatId, messages: [user("slow words please")], trigger: "submit-message" });
  const reader = stream.getReader();
  const seen = [];
  while (seen.filter((c) => c.type === "text-delta").length < 5) seen.push((await reader.read()).value);
  first.close(); // the page goes away: its stream errors, the turn goes on
  await assert.rejects(reader.read());

  const second = new WebSocketChatTransport({ url });
  try {
    const resumed = await second.reconnectToStream({ chatId });
    assert.notEqual(resumed, null);
    const { last, chunks, errors } = await read(resumed);
    assert.deepEqual(errors, []);
    assert.equal(chunks[0].type, "start");
    assert.equal(chunks.at(-1).type, "finish");
    const words = textOf(last).trim().split(" ");
    assert.deepEqual(words, Array.from({ length: 40 }, (_, i) => `w${i}`)); // nothing doubled, nothing lost
    assert.deepEqual(asJson(last), await hubRequest("get_message", { session_id: chatId, message_id: last.id }));
    // Nothing in flight any more: no-active, which the transport reports as null.
    assert.equal(await second.reconnectToStream({ chatId }), null);
  } finally {
    second.close();
  }
});

test("stop(): aborting the request stops the turn, and the stored reply ends where it stopped", { skip }, async () => {
  const chatId = randomUUID();
  const transport = new WebSocketChatTransport({ url });
  try {
    const abort = new AbortController();
    const stream = await transport.sendMessages({
      chatId,
      messages: [user("slow and then stopped")],
      trigger: "submit-message",
      abortSignal: abort.signal,
    });
    const reader = stream.getReader();
    let deltas = 0;
    while (deltas < 3) if ((await reader.read()).value.type === "text-delta") deltas++;
    abort.abort();
    const history = await until(async () => {
      const h = await hubRequest("get_history", { session_id: chatId });
      const turn = await hubRequest("get_turn", { session_id: chatId });
      return h.length === 2 && turn === null ? h : null;
    }, "the turn to stop");
    const words = textOf(history[1]).trim().split(" ");
    assert.ok(words.length < 40, `stopped after ${words.length} words`);
    assert.equal(await transport.reconnectToStream({ chatId }), null);
  } finally {
    transport.close();
  }
});

test("a chat with no turn in flight: reconnectToStream gives null (no-active)", { skip }, async () => {
  const transport = new WebSocketChatTransport({ url });
  try {
    assert.equal(await transport.reconnectToStream({ chatId: randomUUID() }), null);
  } finally {
    transport.close();
  }
});
