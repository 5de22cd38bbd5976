// Two tabs of one chat on two hub nodes (two `sessionhub serve` on one Postgres, the
// Postgres bus): Cloudflare's own AgentClient and WebSocketChatTransport (`agents` 0.32) on
// each. tests/adapters/test_cf_agents.py starts the nodes and a responder on node A, and
// sets SESSIONHUB_URL (node A) and SESSIONHUB_URL_B (node B).
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { AgentClient } from "agents/client";
import { WebSocketChatTransport } from "agents/chat/transport";
import { readUIMessageStream } from "ai";

const urlA = process.env.SESSIONHUB_URL;
const urlB = process.env.SESSIONHUB_URL_B;
const skip = !urlA || !urlB ? "needs SESSIONHUB_URL and SESSIONHUB_URL_B" : false;
const AGENT = "chat-agent";

const user = (text) => ({ id: randomUUID(), role: "user", parts: [{ type: "text", text }] });
const textOf = (m) => m.parts.filter((p) => p.type === "text").map((p) => p.text).join("");
const forty = Array.from({ length: 40 }, (_, i) => `w${i}`);

async function open(base, name) {
  const client = new AgentClient({ agent: AGENT, name, host: base.replace(/^https?:\/\//, ""), protocol: "ws" });
  const frames = [];
  const transport = new WebSocketChatTransport({ agent: client });
  client.addEventListener("message", (event) => frames.push(JSON.parse(event.data)));
  await client.ready;
  await until(() => frames.some((f) => f.type === "cf_agent_chat_messages"), "the history on connect");
  return { client, transport, frames };
}

async function until(check, what, ms = 10000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function lastMessage(stream) {
  let last = null;
  for await (const message of readUIMessageStream({ stream })) last = message;
  return last;
}

/** The reply another tab was relayed, rebuilt from its chunk frames with the AI SDK. */
async function relayed(frames, afterIndex = 0) {
  const chunks = frames
    .slice(afterIndex)
    .filter((f) => f.type === "cf_agent_use_chat_response" && !f.done && f.body)
    .map((f) => JSON.parse(f.body));
  const stream = new ReadableStream({ start(c) { for (const chunk of chunks) c.enqueue(chunk); c.close(); } });
  return lastMessage(stream);
}

const transcriptWith = (frames, ids) => () => {
  const t = frames.filter((f) => f.type === "cf_agent_chat_messages").at(-1);
  return t && t.messages.length === ids.length && t.messages.every((m, i) => m.id === ids[i]) ? t : null;
};

test("a tab on node B sees node A's messages and reply live, and the reverse; clear reaches both", { skip }, async () => {
  const name = randomUUID();
  const a = await open(urlA, name);
  const b = await open(urlB, name);
  try {
    // Tab A on node A asks; tab B on node B sees the question, then the reply streaming.
    const first = user("slow across nodes");
    const reply = await lastMessage(await a.transport.sendMessages({ chatId: name, messages: [first], trigger: "submit-message" }));
    assert.deepEqual(textOf(reply).trim().split(" "), forty);
    await until(() => b.frames.some((f) => f.type === "cf_agent_chat_messages" && f.messages.some((m) => m.id === first.id)), "the question on B");
    const end = await until(() => b.frames.find((f) => f.type === "cf_agent_use_chat_response" && f.done), "the end of the reply on B");
    assert.equal(end.outcome, "completed");
    const seen = await relayed(b.frames);
    assert.equal(seen.id, reply.id);
    assert.deepEqual(textOf(seen).trim().split(" "), forty);
    await until(transcriptWith(b.frames, [first.id, reply.id]), "the transcript on B");

    // The other way: tab B on node B asks (the turn is offered to A's responder).
    const mark = a.frames.length;
    const second = user("hello from b");
    const back = await lastMessage(await b.transport.sendMessages({ chatId: name, messages: [first, reply, second], trigger: "submit-message" }));
    assert.equal(textOf(back), "You said: hello from b");
    await until(transcriptWith(a.frames, [first.id, reply.id, second.id, back.id]), "the transcript on A");
    assert.equal(textOf(await relayed(a.frames, mark)), "You said: hello from b");

    // A clear on node A reaches the tab on node B.
    a.client.send(JSON.stringify({ type: "cf_agent_chat_clear" }));
    await until(() => b.frames.some((f) => f.type === "cf_agent_chat_clear"), "the clear on B");
    const stored = await (await fetch(`${urlB}/agents/${AGENT}/${name}/get-messages`)).json();
    assert.deepEqual(stored, []);
    // Each tab was told once: no echo of its own clear, no second clear.
    assert.equal(a.frames.filter((f) => f.type === "cf_agent_chat_clear").length, 0);
    assert.equal(b.frames.filter((f) => f.type === "cf_agent_chat_clear").length, 1);
  } finally {
    a.client.close();
    b.client.close();
  }
});
