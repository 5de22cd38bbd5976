// The real AG-UI client (@ag-ui/client 1.0 HttpAgent, @ag-ui/core's event schemas and the
// client's own event-order verifier) against a running hub and responder:
// tests/adapters/test_agui.py starts both and sets SESSIONHUB_URL and SESSIONHUB_WS_URL.
// The responder answers by the user's text (tests/support/chatkit.py).
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { HttpAgent, verifyEvents } from "@ag-ui/client";
import { EventSchemas } from "@ag-ui/core/schemas";
import { from, lastValueFrom, toArray } from "rxjs";
import { HubClient } from "../../web/sessionhub.js";

const base = process.env.SESSIONHUB_URL;
const wsUrl = process.env.SESSIONHUB_WS_URL;
const skip = !base ? "needs SESSIONHUB_URL" : false;

async function hubRequest(op, fields) {
  const hub = new HubClient(wsUrl);
  await hub.connect();
  try {
    return await hub.request(op, fields);
  } finally {
    hub.close();
  }
}

const textOf = (m) => m.parts.filter((p) => p.type === "text").map((p) => p.text).join("");

/** Every event through AG-UI's own schema and order checks; the events, parsed. */
async function checked(events) {
  for (const e of events) EventSchemas.parse(e);
  return lastValueFrom(verifyEvents(false)(from(events)).pipe(toArray()));
}

/** The SSE events of a response, with their ids: [{id, event}]. Stops after `stopAfter`. */
async function readSse(response, stopAfter = Infinity) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  const out = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let id = null;
      let data = null;
      for (const line of block.split("\n")) {
        if (line.startsWith("id: ")) id = line.slice(4);
        else if (line.startsWith("data: ")) data = line.slice(6);
      }
      if (data !== null) out.push({ id, event: JSON.parse(data) });
      if (out.length >= stopAfter) {
        await reader.cancel();
        return out;
      }
    }
  }
  return out;
}

test("HttpAgent.runAgent: the reply arrives as AG-UI events and is what the hub stored", { skip }, async () => {
  const threadId = randomUUID();
  const agent = new HttpAgent({ url: `${base}/agui`, threadId });
  const seen = [];
  agent.messages = [{ id: randomUUID(), role: "user", content: "hello agui" }];
  const run = await agent.runAgent({ runId: randomUUID() }, { onEvent: ({ event }) => seen.push(event) });
  await checked(seen);
  assert.equal(seen[0].type, "RUN_STARTED");
  assert.equal(seen.at(-1).type, "RUN_FINISHED");
  assert.equal(seen.at(-1).outcome.type, "success");
  const reply = run.newMessages.find((m) => m.role === "assistant");
  assert.equal(reply.content, "You said: hello agui");
  const history = await hubRequest("get_history", { session_id: threadId });
  assert.equal(history.length, 2);
  assert.equal(history[1].id, reply.id);
  assert.equal(textOf(history[1]), reply.content);

  // A tool call and reasoning, in a second run of the same agent: it sends its whole history
  // back, and the hub appends only the new message.
  agent.messages = [...agent.messages, { id: randomUUID(), role: "user", content: "tool lookup please" }];
  const events = [];
  const second = await agent.runAgent({ runId: randomUUID() }, { onEvent: ({ event }) => events.push(event) });
  await checked(events);
  const types = events.map((e) => e.type);
  for (const t of ["REASONING_START", "REASONING_MESSAGE_CONTENT", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT", "TEXT_MESSAGE_CONTENT"]) {
    assert.ok(types.includes(t), `${t} in ${types}`);
  }
  const assistant = second.newMessages.find((m) => m.role === "assistant" && m.toolCalls);
  assert.equal(assistant.toolCalls[0].function.name, "lookup");
  assert.deepEqual(JSON.parse(assistant.toolCalls[0].function.arguments), { q: "tool lookup please" });
  const result = second.newMessages.find((m) => m.role === "tool");
  assert.deepEqual(JSON.parse(result.content), { found: 3 });
  assert.equal(assistant.content, "Found 3.");
  const after = await hubRequest("get_history", { session_id: threadId });
  assert.equal(after.length, 4);
});

test("a run re-attached with Last-Event-ID gives the rest exactly once", { skip }, async () => {
  const threadId = randomUUID();
  const runId = randomUUID();
  const post = await fetch(`${base}/agui`, {
    method: "POST",
    headers: { "content-type": "application/json", accept: "text/event-stream" },
    body: JSON.stringify({ threadId, runId, messages: [{ id: randomUUID(), role: "user", content: "slow words" }], tools: [], context: [] }),
  });
  assert.equal(post.status, 200);
  const first = await readSse(post, 12); // the page goes away mid-run
  const lastId = first.at(-1).id;
  assert.equal(lastId, `${runId}:11`);
  const again = await fetch(`${base}/agui/${threadId}/stream`, { headers: { "last-event-id": lastId } });
  assert.equal(again.status, 200);
  const rest = await readSse(again);
  // Opened again without ids (RUN_STARTED, the open text message), then the events after 11.
  const numbered = rest.filter((r) => r.id !== null);
  assert.deepEqual(numbered.map((r) => r.id), numbered.map((_, i) => `${runId}:${12 + i}`));
  // AG-UI's own checks accept the continuation as a stream of its own.
  await checked(rest.map((r) => r.event));
  const text = [...first, ...numbered]
    .filter((r) => r.event.type === "TEXT_MESSAGE_CONTENT")
    .map((r) => r.event.delta)
    .join("");
  assert.deepEqual(text.trim().split(" "), Array.from({ length: 40 }, (_, i) => `w${i}`));
  assert.equal(rest.at(-1).event.type, "RUN_FINISHED");
  // Nothing in flight any more.
  assert.equal((await fetch(`${base}/agui/${threadId}/stream`)).status, 204);
});

test("re-attached without Last-Event-ID: the thread as a snapshot, then the whole reply", { skip }, async () => {
  const threadId = randomUUID();
  const userId = randomUUID();
  const post = await fetch(`${base}/agui`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ threadId, runId: randomUUID(), messages: [{ id: userId, role: "user", content: "slow again" }] }),
  });
  await readSse(post, 6);
  const again = await readSse(await fetch(`${base}/agui/${threadId}/stream`));
  const events = await checked(again.map((r) => r.event));
  assert.equal(events[0].type, "RUN_STARTED");
  assert.equal(events[1].type, "MESSAGES_SNAPSHOT");
  assert.deepEqual(events[1].messages.map((m) => m.id), [userId]);
  const text = events.filter((e) => e.type === "TEXT_MESSAGE_CONTENT").map((e) => e.delta).join("");
  assert.deepEqual(text.trim().split(" "), Array.from({ length: 40 }, (_, i) => `w${i}`));
});

test("errors before the stream are typed JSON", { skip }, async () => {
  const bad = await fetch(`${base}/agui`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
  assert.equal(bad.status, 400);
  assert.equal((await bad.json()).error.code, "invalid");
  const empty = await fetch(`${base}/agui`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ threadId: randomUUID(), runId: "r", messages: [] }),
  });
  assert.equal(empty.status, 400);
});
