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

/** Every message readUIMessageStream yields, the last one, and the chunks seen; `message`:
 * the page's copy of a reply the stream continues (after the user answered a tool). */
async function read(stream, message = undefined) {
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
  let last = message ?? null;
  for await (const m of readUIMessageStream({ message, stream: tee, onError: (e) => errors.push(e) })) last = m;
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

/** What addToolApprovalResponse leaves in the page's copy of the reply. */
function answered(message, approved, reason, approvalId) {
  const page = JSON.parse(JSON.stringify(message));
  for (const part of page.parts) {
    if (part.state === "approval-requested") {
      part.state = "approval-responded";
      part.approval = { ...part.approval, id: approvalId ?? part.approval.id, approved, ...(reason ? { reason } : {}) };
    }
  }
  return page;
}

for (const approved of [true, false]) {
  test(`a tool approval round trip (${approved ? "approved" : "denied"}): the reply asks, ends its request, and goes on as the same message`, { skip }, async () => {
    const transport = new WebSocketChatTransport({ url });
    try {
      const chatId = randomUUID();
      const ask = user("approve the deploy");
      const first = await read(await transport.sendMessages({ chatId, messages: [ask], trigger: "submit-message" }));
      assert.deepEqual(first.errors, []);
      const tool = first.last.parts.find((p) => p.type === "tool-deploy");
      assert.equal(tool.state, "approval-requested");
      assert.ok(tool.approval.id);
      assert.equal(first.chunks.at(-1).type, "finish");
      // The turn is still open on the hub, waiting.
      assert.notEqual(await hubRequest("get_turn", { session_id: chatId }), null);

      const page = answered(first.last, approved, approved ? undefined : "not on a Friday");
      const second = await read(
        await transport.sendMessages({ chatId, messages: [ask, page], trigger: "submit-message" }),
        page,
      );
      assert.deepEqual(second.errors, []);
      const done = second.last.parts.find((p) => p.type === "tool-deploy");
      assert.equal(done.state, approved ? "output-available" : "output-denied");
      assert.equal(second.last.id, first.last.id); // the same message, continued
      assert.equal(textOf(second.last), approved ? "Deploy needs your approval.Deployed." : "Deploy needs your approval.Not deployed: not on a Friday.");
      const stored = await until(async () => {
        const turn = await hubRequest("get_turn", { session_id: chatId });
        return turn === null ? hubRequest("get_message", { session_id: chatId, message_id: first.last.id }) : null;
      }, "the turn to end");
      assert.deepEqual(asJson(second.last), stored);
      assert.equal(stored.parts.find((p) => p.type === "tool-deploy").approval.approved, approved);
    } finally {
      transport.close();
    }
  });
}

test("a forged approval (an id the reply never asked) is refused, and the real one still works once", { skip }, async () => {
  const transport = new WebSocketChatTransport({ url });
  try {
    const chatId = randomUUID();
    const ask = user("approve this one");
    const first = await read(await transport.sendMessages({ chatId, messages: [ask], trigger: "submit-message" }));
    const forged = answered(first.last, true, undefined, "ap-forged");
    const refused = await read(
      await transport.sendMessages({ chatId, messages: [ask, forged], trigger: "submit-message" }),
      forged,
    ).catch((error) => ({ errors: [error] }));
    assert.ok(refused.errors.length > 0 && String(refused.errors[0]?.message ?? refused.errors[0]).includes("conflict"), String(refused.errors[0]));
    const still = await hubRequest("get_turn", { session_id: chatId });
    assert.notEqual(still, null);

    const page = answered(first.last, true);
    const second = await read(await transport.sendMessages({ chatId, messages: [ask, page], trigger: "submit-message" }), page);
    assert.deepEqual(second.errors, []);
    assert.equal(second.last.parts.find((p) => p.type === "tool-deploy").state, "output-available");
    // The same answer again (a fresh copy: readUIMessageStream grew `page` in place): nothing
    // is pending any more.
    const repeat = answered(first.last, true);
    const again = await read(
      await transport.sendMessages({ chatId, messages: [ask, repeat], trigger: "submit-message" }),
      repeat,
    ).catch((error) => ({ errors: [error] }));
    assert.ok(again.errors.length > 0, "a repeated approval is refused");
  } finally {
    transport.close();
  }
});

test("a steering message reaches the running turn and shows in the reply as the SDK's steering-message part", { skip }, async () => {
  const transport = new WebSocketChatTransport({ url });
  try {
    const chatId = randomUUID();
    const stream = await transport.sendMessages({ chatId, messages: [user("steer me")], trigger: "submit-message" });
    const reading = read(stream);
    await until(async () => (await hubRequest("get_turn", { session_id: chatId }))?.started, "the turn to start");
    const steered = await fetch(`${base}/api/chat/${chatId}/steer`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ text: "use Paris, Texas" }),
    });
    assert.equal(steered.status, 202);
    const { last, errors } = await reading;
    assert.deepEqual(errors, []);
    const steering = last.parts.find((p) => p.type === "steering-message");
    assert.deepEqual(steering.parts, [{ type: "text", text: "use Paris, Texas" }]);
    assert.equal(textOf(last), "Working -> told: use Paris, Texas Done.");
    const stored = await until(async () => {
      const turn = await hubRequest("get_turn", { session_id: chatId });
      return turn === null ? hubRequest("get_message", { session_id: chatId, message_id: last.id }) : null;
    }, "the turn to end");
    assert.deepEqual(asJson(last), stored);
  } finally {
    transport.close();
  }
});

test("AI SDK 7's other parts arrive losslessly: a reset step, custom, data reconciled by id, reasoning-file, source, metadata", { skip }, async () => {
  const transport = new WebSocketChatTransport({ url });
  try {
    const chatId = randomUUID();
    const { last, chunks, errors } = await read(
      await transport.sendMessages({ chatId, messages: [user("parts please")], trigger: "submit-message" }),
    );
    assert.deepEqual(errors, []);
    const types = chunks.map((c) => c.type);
    for (const t of ["reset-step", "custom", "data-weather", "reasoning-file", "source-url", "message-metadata"]) {
      assert.ok(types.includes(t), `${t} in ${types}`);
    }
    assert.equal(textOf(last), "second try"); // the retried step's text is gone
    assert.deepEqual(last.metadata, { model: "scripted" });
    assert.deepEqual(last.parts.filter((p) => p.type === "data-weather").map((p) => p.data), [{ c: 21 }]);
    const stored = await until(async () => {
      const turn = await hubRequest("get_turn", { session_id: chatId });
      return turn === null ? hubRequest("get_message", { session_id: chatId, message_id: last.id }) : null;
    }, "the turn to end");
    assert.deepEqual(asJson(last), stored);
  } finally {
    transport.close();
  }
});
