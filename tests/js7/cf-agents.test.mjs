// Cloudflare's own client code against a running hub and responder: `agents` 0.32's
// AgentClient (partysocket) and `agents/chat/transport`'s WebSocketChatTransport (what
// useAgentChat drives), with `ai`'s readUIMessageStream. tests/adapters/test_cf_agents.py
// starts both and sets SESSIONHUB_URL. The responder answers by the user's text
// (tests/support/chatkit.py): "slow ..." streams 40 words over about 1.5 s, anything else
// is echoed back.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { AgentClient } from "agents/client";
import { WebSocketChatTransport } from "agents/chat/transport";
import { readUIMessageStream } from "ai";

const base = process.env.SESSIONHUB_URL;
const skip = !base ? "needs SESSIONHUB_URL" : false;
const host = base.replace(/^https?:\/\//, "");
const AGENT = "chat-agent";

const user = (text) => ({ id: randomUUID(), role: "user", parts: [{ type: "text", text }] });
const textOf = (m) => m.parts.filter((p) => p.type === "text").map((p) => p.text).join("");
const words = (m) => textOf(m).trim().split(" ");
const forty = Array.from({ length: 40 }, (_, i) => `w${i}`);

/** A client and its transport, glued as useAgentChat glues them (resume offers go to the
 * transport), and every frame it was sent. */
async function open(name) {
  const client = new AgentClient({ agent: AGENT, name, host, protocol: "ws" });
  const frames = [];
  const transport = new WebSocketChatTransport({ agent: client });
  client.addEventListener("message", (event) => {
    const data = JSON.parse(event.data);
    frames.push(data);
    if (data.type === "cf_agent_stream_resuming") transport.handleStreamResuming(data);
    if (data.type === "cf_agent_stream_resume_none") transport.handleStreamResumeNone(data);
  });
  await client.ready;
  // The history follows the identity: what useAgentChat shows first.
  await until(() => frames.some((f) => f.type === "cf_agent_chat_messages"), "the history on connect");
  return { client, transport, frames };
}

async function read(stream) {
  let last = null;
  const chunks = [];
  const tee = stream.pipeThrough(new TransformStream({ transform(c, ctl) { chunks.push(c); ctl.enqueue(c); } }));
  for await (const message of readUIMessageStream({ stream: tee })) last = message;
  return { last, chunks };
}

async function stored(name) {
  const r = await fetch(`${base}/agents/${AGENT}/${name}/get-messages`);
  assert.equal(r.status, 200);
  return r.json();
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

test("identity and history on connect; a reply streams and is what the hub stored", { skip }, async () => {
  const name = randomUUID();
  const a = await open(name);
  const b = await open(name); // a second tab
  try {
    assert.equal(a.client.agent, AGENT);
    assert.equal(a.client.name, name);
    const transcript = await until(() => a.frames.find((f) => f.type === "cf_agent_chat_messages"), "the history");
    assert.deepEqual(transcript.messages, []);
    assert.equal(transcript.connect, true);
    const first = user("hello cloudflare");
    const { last, chunks } = await read(await a.transport.sendMessages({ chatId: name, messages: [first], trigger: "submit-message" }));
    assert.equal(chunks[0].type, "start");
    assert.equal(textOf(last), "You said: hello cloudflare");
    const history = await stored(name);
    assert.deepEqual(history.map((m) => m.id), [first.id, last.id]);
    assert.equal(textOf(history[1]), textOf(last));
    // The other tab saw the reply stream, then the transcript.
    const seen = await until(() => {
      const t = b.frames.filter((f) => f.type === "cf_agent_chat_messages").at(-1);
      return t && t.messages.length === 2 ? t : null;
    }, "the other tab's transcript");
    assert.deepEqual(seen.messages.map((m) => m.id), [first.id, last.id]);
    const streamed = b.frames.filter((f) => f.type === "cf_agent_use_chat_response");
    assert.ok(streamed.some((f) => f.done === false && f.body));
    assert.equal(streamed.at(-1).outcome, "completed");
  } finally {
    a.client.close();
    b.client.close();
  }
});

test("a reload mid-reply resumes it: replay then live, every word once", { skip }, async () => {
  const name = randomUUID();
  const a = await open(name);
  const stream = await a.transport.sendMessages({ chatId: name, messages: [user("slow words")], trigger: "submit-message" });
  const reader = stream.getReader();
  let deltas = 0;
  while (deltas < 5) if ((await reader.read()).value?.type === "text-delta") deltas++;
  a.client.close(); // the page reloads

  const b = await open(name);
  try {
    const resumed = await b.transport.reconnectToStream({ chatId: name });
    assert.notEqual(resumed, null);
    const { last } = await read(resumed);
    assert.deepEqual(words(last), forty);
    const history = await until(async () => {
      const h = await stored(name);
      return h.length === 2 && words(h[1]).length === 40 ? h : null;
    }, "the stored reply");
    assert.equal(history[1].id, last.id);
    assert.ok(b.frames.some((f) => f.type === "cf_agent_use_chat_response" && f.replayComplete));
    // Nothing in flight now: the probe is answered "none".
    assert.equal(await b.transport.reconnectToStream({ chatId: name }), null);
  } finally {
    b.client.close();
  }
});

test("cancel stops the turn; clear empties the chat and tells the other tab", { skip }, async () => {
  const name = randomUUID();
  const a = await open(name);
  const b = await open(name);
  try {
    const stream = await a.transport.sendMessages({ chatId: name, messages: [user("slow then cancel")], trigger: "submit-message" });
    const reader = stream.getReader();
    let deltas = 0;
    while (deltas < 3) if ((await reader.read()).value?.type === "text-delta") deltas++;
    assert.equal(a.transport.cancelActiveServerTurn(), true);
    const end = await until(
      () => a.frames.find((f) => f.type === "cf_agent_use_chat_response" && f.done),
      "the end of the cancelled reply",
    );
    assert.equal(end.outcome, "aborted");
    const history = await until(async () => {
      const h = await stored(name);
      return h.length === 2 ? h : null;
    }, "the stored, stopped reply");
    assert.ok(words(history[1]).length < 40);

    a.client.send(JSON.stringify({ type: "cf_agent_chat_clear" }));
    await until(() => b.frames.some((f) => f.type === "cf_agent_chat_clear"), "the other tab's clear");
    assert.deepEqual(await stored(name), []);
  } finally {
    a.client.close();
    b.client.close();
  }
});
