// The real AI SDK (ai 6.x) against a running hub and responder: tests/adapters/test_aisdk_chat.py
// starts both and sets SESSIONHUB_URL and SESSIONHUB_WS_URL. The responder answers by the
// user's text: "tool ..." streams reasoning, a tool call and its result, then text;
// "slow ..." streams 40 words over about 1.5 s; "fail ..." fails after one word; anything
// else is echoed back in three deltas.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { DefaultChatTransport, readUIMessageStream, validateUIMessages } from "ai";
import { HubClient } from "../../web/sessionhub.js";
import { SessionHubChatTransport } from "../../web/chat-transport.js";

const base = process.env.SESSIONHUB_URL;
const wsUrl = process.env.SESSIONHUB_WS_URL;
const skip = !base || typeof WebSocket !== "function" ? "needs SESSIONHUB_URL and a global WebSocket" : false;

const user = (text) => ({ id: randomUUID(), role: "user", parts: [{ type: "text", text }] });

/** The hub's stored message, through the hub's own socket. */
async function stored(sessionId, messageId) {
  const hub = new HubClient(wsUrl);
  await hub.connect();
  try {
    return await hub.request("get_message", { session_id: sessionId, message_id: messageId });
  } finally {
    hub.close();
  }
}

async function history(sessionId) {
  const hub = new HubClient(wsUrl);
  await hub.connect();
  try {
    return await hub.request("get_history", { session_id: sessionId });
  } finally {
    hub.close();
  }
}

/** The SDK's message as JSON (it leaves `undefined` fields around), minus what the SDK
 * adds for rendering only: `state` ("streaming"/"done") on text and reasoning parts, and
 * on reasoning parts the id of the chunks that carried them. */
function asJson(message) {
  const m = JSON.parse(JSON.stringify(message));
  for (const part of m.parts) {
    if (part.type === "text" || part.type === "reasoning") delete part.state;
    if (part.type === "reasoning" && part.id === `reasoning-${m.parts.indexOf(part)}`) delete part.id;
  }
  return m;
}

/** Every message readUIMessageStream yields, the last one, and the chunks seen. */
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

/** Read a few chunks, then drop the stream (a page reload mid-reply). */
async function readSome(stream, count) {
  const reader = stream.getReader();
  const chunks = [];
  while (chunks.length < count) {
    const { value, done } = await reader.read();
    if (done) break;
    chunks.push(value);
  }
  await reader.cancel();
  return chunks;
}

const transports = {
  DefaultChatTransport: () => new DefaultChatTransport({ api: `${base}/api/chat` }),
  SessionHubChatTransport: () => new SessionHubChatTransport({ url: wsUrl }),
};

async function newChat(kind) {
  if (kind === "DefaultChatTransport") return randomUUID(); // POST /api/chat creates it
  const hub = new HubClient(wsUrl);
  await hub.connect();
  try {
    return (await hub.request("create", { name: "ws chat" })).id;
  } finally {
    hub.close();
  }
}

for (const [kind, make] of Object.entries(transports)) {
  test(`${kind}: sendMessages + readUIMessageStream give the message the hub stored`, { skip }, async () => {
    const transport = make();
    try {
      const chatId = await newChat(kind);
      const first = user("hello there");
      const { last, chunks, errors } = await read(
        await transport.sendMessages({ chatId, messages: [first], trigger: "submit-message", messageId: undefined }),
      );
      assert.deepEqual(errors, []);
      assert.equal(chunks[0].type, "start");
      assert.equal(chunks.at(-1).type, "finish");
      assert.deepEqual(asJson(last), await stored(chatId, last.id));
      assert.equal(last.parts.map((p) => p.text).join(""), "You said: hello there");

      // A tool call round trip: reasoning, the tool part through its states, then text.
      const second = user("tool lookup please");
      const tool = await read(
        await transport.sendMessages({ chatId, messages: [first, last, second], trigger: "submit-message" }),
      );
      assert.deepEqual(tool.errors, []);
      const types = tool.chunks.map((c) => c.type);
      for (const t of ["reasoning-start", "tool-input-start", "tool-input-available", "tool-output-available", "text-delta"]) {
        assert.ok(types.includes(t), `${t} in ${types}`);
      }
      assert.deepEqual(asJson(tool.last), await stored(chatId, tool.last.id));
      assert.deepEqual(
        tool.last.parts.map((p) => p.type),
        ["reasoning", "tool-lookup", "text"],
      );

      // Regenerate: a sibling of the reply it replaces; the tree keeps both.
      const again = await read(
        await transport.sendMessages({
          chatId,
          messages: [first, last, second],
          trigger: "regenerate-message",
          messageId: tool.last.id,
        }),
      );
      assert.notEqual(again.last.id, tool.last.id);
      assert.deepEqual(asJson(again.last), await stored(chatId, again.last.id));
      const hub = new HubClient(wsUrl);
      await hub.connect();
      try {
        const siblings = await hub.request("get_branches", { session_id: chatId, message_id: second.id });
        assert.deepEqual(siblings.map((m) => m.id).sort(), [tool.last.id, again.last.id].sort());
      } finally {
        hub.close();
      }

      // Every message the hub returns is a valid UIMessage for the SDK.
      const all = await history(chatId);
      assert.equal(all.length, 4);
      await validateUIMessages({ messages: all });
    } finally {
      transport.close?.();
    }
  });

  test(`${kind}: reconnectToStream mid-reply yields the complete reply`, { skip }, async () => {
    const transport = make();
    try {
      const chatId = await newChat(kind);
      assert.equal(await transport.reconnectToStream({ chatId }), null, "nothing in flight: null");
      const question = user("slow story please");
      const abort = new AbortController();
      const first = await readSome(
        await transport.sendMessages({ chatId, messages: [question], trigger: "submit-message", abortSignal: abort.signal }),
        4,
      );
      // A reload mid-reply: over HTTP the fetch is aborted (a disconnect: the reply goes on);
      // over the socket nothing is aborted (the transport's abort is the SDK's stop()).
      if (kind === "DefaultChatTransport") abort.abort();
      assert.equal(first[0].type, "start");
      const resumed = await transport.reconnectToStream({ chatId });
      assert.ok(resumed, "a reply is in flight");
      const { last, chunks, errors } = await read(resumed);
      assert.deepEqual(errors, []);
      assert.equal(chunks[0].type, "start");
      assert.equal(chunks[0].messageId, first[0].messageId, "the same message resumes");
      assert.equal(chunks.filter((c) => c.type === "start").length, 1);
      const saved = await stored(chatId, last.id);
      assert.deepEqual(asJson(last), saved);
      const words = saved.parts[0].text.trim().split(" ");
      assert.equal(words.length, 40);
      assert.deepEqual(words, Array.from({ length: 40 }, (_, i) => `w${i}`), "nothing doubled or lost");
      assert.equal(await transport.reconnectToStream({ chatId }), null, "the turn ended");
    } finally {
      transport.close?.();
    }
  });

  test(`${kind}: stopping stops the turn; the reply is stored as it stood`, { skip }, async () => {
    const transport = make();
    try {
      const chatId = await newChat(kind);
      const abort = new AbortController();
      const stream = await transport.sendMessages({
        chatId,
        messages: [user("slow stop please")],
        trigger: "submit-message",
        abortSignal: abort.signal,
      });
      const first = await readSome(stream, 4);
      if (kind === "DefaultChatTransport") {
        // stop() only closes the fetch: the stop endpoint stops the turn.
        abort.abort();
        const r = await fetch(`${base}/api/chat/${chatId}/stop`, { method: "POST" });
        assert.equal(r.status, 200, await r.text());
      } else {
        abort.abort(); // the SDK's stop(): the transport sends stop_turn
      }
      let resumed = null;
      for (let i = 0; i < 100 && (resumed = await transport.reconnectToStream({ chatId })) !== null; i++) {
        await resumed.cancel();
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      assert.equal(resumed, null, "no turn in flight once stopped");
      const saved = await stored(chatId, first[0].messageId);
      const words = saved.parts[0].text.trim().split(" ");
      assert.ok(words.length >= 1 && words.length < 40, `stopped partway: ${words.length} words`);
      const hub = new HubClient(wsUrl);
      await hub.connect();
      try {
        await assert.rejects(hub.request("stop_turn", { session_id: chatId }), (err) => err.code === "not_found");
      } finally {
        hub.close();
      }
    } finally {
      transport.close?.();
    }
  });

  test(`${kind}: a failing responder ends the stream with an error chunk`, { skip }, async () => {
    const transport = make();
    try {
      const chatId = await newChat(kind);
      const { chunks, errors } = await read(
        await transport.sendMessages({ chatId, messages: [user("fail now")], trigger: "submit-message" }),
      );
      const error = chunks.find((c) => c.type === "error");
      assert.ok(error, JSON.stringify(chunks));
      assert.match(error.errorText, /the model is down/);
      assert.equal(errors.length, 1);
    } finally {
      transport.close?.();
    }
  });
}

test("AI SDK 6 DefaultChatTransport: a tool approval round trip continues the same message", { skip }, async () => {
  const transport = new DefaultChatTransport({ api: `${base}/api/chat` });
  const chatId = randomUUID();
  const ask = user("approve the deploy");
  const first = await read(await transport.sendMessages({ chatId, messages: [ask], trigger: "submit-message" }));
  assert.deepEqual(first.errors, []);
  const tool = first.last.parts.find((p) => p.type === "tool-deploy");
  assert.equal(tool.state, "approval-requested");
  // What addToolApprovalResponse leaves in the page's copy.
  const page = JSON.parse(JSON.stringify(first.last));
  const asked = page.parts.find((p) => p.type === "tool-deploy");
  asked.state = "approval-responded";
  asked.approval = { ...asked.approval, approved: true };
  const chunks = [];
  const errors = [];
  const stream = (await transport.sendMessages({ chatId, messages: [ask, page], trigger: "submit-message" })).pipeThrough(
    new TransformStream({
      transform(chunk, controller) {
        chunks.push(chunk);
        controller.enqueue(chunk);
      },
    }),
  );
  let last = page;
  for await (const m of readUIMessageStream({ message: page, stream, onError: (e) => errors.push(e) })) last = m;
  assert.deepEqual(errors, []);
  assert.equal(last.id, first.last.id);
  assert.equal(last.parts.find((p) => p.type === "tool-deploy").state, "output-available");
  // Nothing of AI SDK 7's chunk set went to an AI SDK 6 page.
  assert.ok(!chunks.some((c) => c.type === "tool-approval-response"), JSON.stringify(chunks));
  for (let i = 0; i < 100 && (await history(chatId)).at(-1)?.parts.at(-1)?.text !== "Deployed."; i++) {
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.deepEqual(asJson(last), await stored(chatId, last.id));
});
