// The real AG-UI client (@ag-ui/client 1.0 HttpAgent, @ag-ui/core's event schemas and the
// client's own event-order verifier) against a running hub and responder:
// tests/adapters/test_agui.py starts both and sets SESSIONHUB_URL and SESSIONHUB_WS_URL.
// The responder answers by the user's text (tests/support/chatkit.py).
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { HttpAgent, runHttpRequest, transformHttpEventStream, verifyEvents } from "@ag-ui/client";
import { EventSchemas } from "@ag-ui/core/schemas";
import { from, lastValueFrom, take as first, toArray } from "rxjs";
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

/** The SSE events of a response as they come: {id, event} each. */
async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
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
        if (data !== null) yield { id, event: JSON.parse(data) };
      }
    }
  } finally {
    await reader.cancel().catch(() => {});
  }
}

/** The SSE events of a response, with their ids: [{id, event}]. Stops after `stop` events
 * (a number) or once `stop(events)` says so, and hangs up. */
async function readSse(response, stop = Infinity) {
  const enough = typeof stop === "number" ? (out) => out.length >= stop : stop;
  const out = [];
  for await (const item of sseEvents(response)) {
    out.push(item);
    if (enough(out)) break;
  }
  return out;
}

/** The hub's event id, parsed: <seq>:<n>:<tag>. */
const parseId = (id) => {
  const [seq, n, tag] = id.split(":");
  return { seq: Number(seq), n: Number(n), tag };
};

const finished = (count) => (out) => out.filter((r) => r.event.type === "RUN_FINISHED").length >= count;

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
  const { seq, n, tag } = parseId(lastId);
  assert.equal(n, 11);
  assert.deepEqual(first.map((r) => r.id), first.map((_, i) => `${seq}:${i}:${tag}`));
  const again = await fetch(`${base}/agui/${threadId}/stream`, { headers: { "last-event-id": lastId } });
  assert.equal(again.status, 200);
  const rest = await readSse(again);
  // Opened again without ids (RUN_STARTED, the open text message), then the events after 11.
  const numbered = rest.filter((r) => r.id !== null);
  assert.deepEqual(numbered.map((r) => r.id), numbered.map((_, i) => `${seq}:${12 + i}:${tag}`));
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

/** A run posted as HttpAgent posts it; its response (not read). */
function post(threadId, text, runId = randomUUID(), extra = {}) {
  return fetch(`${base}/agui`, {
    method: "POST",
    headers: { "content-type": "application/json", accept: "text/event-stream" },
    body: JSON.stringify({ threadId, runId, messages: [{ id: randomUUID(), role: "user", content: text }], tools: [], context: [], ...extra }),
  });
}

/** Split a follow stream into its runs (each from RUN_STARTED to its end). */
function runsOf(items) {
  const runs = [];
  for (const item of items) {
    if (item.event.type === "RUN_STARTED") runs.push([]);
    runs.at(-1).push(item);
  }
  return runs;
}

const textIn = (items) => items.filter((r) => r.event.type === "TEXT_MESSAGE_CONTENT").map((r) => r.event.delta).join("");

test("follow mode: the thread on attach, then every later run, resumed exactly across runs", { skip }, async () => {
  const threadId = randomUUID();
  const follow = await fetch(`${base}/agui/${threadId}/stream?follow=1`);
  assert.equal(follow.status, 200);
  const stream = sseEvents(follow);
  const take = async (enough) => {
    const out = [];
    for (;;) {
      const { value, done } = await stream.next();
      assert.ok(!done, "the follow stream ended");
      out.push(value);
      if (enough(out)) return out;
    }
  };
  // Nothing in flight: a sync run tells the reader the (empty) thread.
  const sync = await take(finished(1));
  assert.deepEqual(sync.map((r) => r.event.type), ["RUN_STARTED", "MESSAGES_SNAPSHOT", "STATE_SNAPSHOT", "RUN_FINISHED"]);
  assert.deepEqual(sync[1].event.messages, []);
  // The client's own SSE parser and order checks read a follow stream too (docs/chat.md).
  const hangUp = new AbortController(); // an unsubscribe alone leaves the request open
  const parsed = await lastValueFrom(
    transformHttpEventStream(runHttpRequest(() => fetch(`${base}/agui/${threadId}/stream?follow=1`, { signal: hangUp.signal })))
      .pipe(verifyEvents(false), first(4), toArray()),
  );
  hangUp.abort();
  assert.deepEqual(parsed.map((e) => e.type), sync.map((r) => r.event.type));

  // Another client runs the thread twice with the real HttpAgent: the follower sees both.
  const agent = new HttpAgent({ url: `${base}/agui`, threadId });
  agent.messages = [{ id: randomUUID(), role: "user", content: "hello follow" }];
  const firstRun = randomUUID();
  const done = agent.runAgent({ runId: firstRun });
  const one = await take(finished(1));
  await done;
  assert.equal(one[0].event.runId, firstRun);
  assert.equal(one[1].event.type, "MESSAGES_SNAPSHOT");
  assert.deepEqual(one[1].event.messages.map((m) => m.content), ["hello follow"]);
  assert.equal(textIn(one), "You said: hello follow");

  // The second, slow run: the follower goes away mid-reply and comes back.
  agent.messages = [...agent.messages, { id: randomUUID(), role: "user", content: "slow follow" }];
  const slow = agent.runAgent({ runId: randomUUID() });
  const before = await take((out) => out.filter((r) => r.event.type === "TEXT_MESSAGE_CONTENT").length >= 5);
  await stream.return();
  const lastId = before.at(-1).id;
  const again = await fetch(`${base}/agui/${threadId}/stream?follow=1`, { headers: { "last-event-id": lastId } });
  assert.equal(again.status, 200);
  const rest = sseEvents(again);
  const after = [];
  for (;;) {
    const { value } = await rest.next();
    after.push(value);
    if (value.event.type === "RUN_FINISHED") break;
  }
  await slow;
  const numbered = after.filter((r) => r.id !== null);
  const { seq, n, tag } = parseId(lastId);
  assert.deepEqual(numbered.map((r) => r.id), numbered.map((_, i) => `${seq}:${n + 1 + i}:${tag}`));
  assert.deepEqual((textIn(before) + textIn(numbered)).trim().split(" "), Array.from({ length: 40 }, (_, i) => `w${i}`));

  // A third run comes on the resumed stream; its ids are after the second run's.
  agent.messages = [...agent.messages, { id: randomUUID(), role: "user", content: "third" }];
  await agent.runAgent({ runId: randomUUID() });
  const third = [];
  for (;;) {
    const { value } = await rest.next();
    third.push(value);
    if (value.event.type === "RUN_FINISHED") break;
  }
  await rest.return();
  assert.ok(parseId(third[0].id).seq > seq);
  assert.deepEqual(third[1].event.messages.map((m) => m.role), ["user", "assistant", "user", "assistant", "user"]);
  assert.equal(textIn(third), "You said: third");

  // Every connection's stream is valid AG-UI, run after run, by the client's own checks.
  await checked([...sync, ...one, ...before].map((r) => r.event));
  await checked([...after, ...third].map((r) => r.event));
  for (const run of [one, ...runsOf([...after, ...third])]) {
    const ns = run.filter((r) => r.id !== null).map((r) => parseId(r.id).n);
    assert.deepEqual(ns, [...ns].sort((a, b) => a - b));
  }

  // Back with the id of the third run's end: nothing again, the next run is the first thing.
  const last = third.at(-1).id;
  const back = sseEvents(await fetch(`${base}/agui/${threadId}/stream?follow=1`, { headers: { "last-event-id": last } }));
  const fourth = post(threadId, "fourth");
  const next = [];
  for (;;) {
    const { value } = await back.next();
    next.push(value);
    if (value.event.type === "RUN_FINISHED") break;
  }
  await back.return();
  await (await fourth).text();
  assert.equal(next[0].event.type, "RUN_STARTED");
  assert.equal(textIn(next), "You said: fourth");
  await checked(next.map((r) => r.event));
});

test("STATE_DELTA: a block changed mid-run reaches the client's state; a bad state is a RUN_ERROR", { skip }, async () => {
  const threadId = randomUUID();
  const agent = new HttpAgent({ url: `${base}/agui`, threadId });
  agent.messages = [{ id: randomUUID(), role: "user", content: "slow state" }];
  agent.state = { contextBlocks: { memory: "likes tea" } };
  const events = [];
  let changed = false;
  await agent.runAgent(
    { runId: randomUUID() },
    {
      onEvent: ({ event }) => {
        events.push(event);
        if (!changed && event.type === "TEXT_MESSAGE_CONTENT") {
          changed = true; // a WebSocket client writes the block while the reply streams
          hubRequest("replace_context_block", { session_id: threadId, label: "memory", content: "likes coffee" });
        }
      },
    },
  );
  await checked(events);
  const snapshots = events.filter((e) => e.type === "STATE_SNAPSHOT");
  assert.deepEqual(snapshots[0].snapshot.contextBlocks.memory, "likes tea"); // the input state, applied
  const deltas = events.filter((e) => e.type === "STATE_DELTA");
  assert.deepEqual(deltas.map((e) => e.delta), [[{ op: "replace", path: "/contextBlocks/memory", value: "likes coffee" }]]);
  // The client applied the patch itself (fast-json-patch inside @ag-ui/client).
  assert.equal(agent.state.contextBlocks.memory, "likes coffee");
  assert.equal(agent.state.contextBlocks.soul, "kind");

  // A read-only block in the input state: RUN_ERROR with the hub's code; nothing written.
  agent.messages = [...agent.messages, { id: randomUUID(), role: "user", content: "hi" }];
  agent.state = { contextBlocks: { ...agent.state.contextBlocks, memory: "likes juice", soul: "cruel" } };
  const refused = [];
  await agent.runAgent({ runId: randomUUID() }, { onEvent: ({ event }) => refused.push(event) }).catch(() => {});
  assert.equal(refused.length, 1);
  assert.equal(refused[0].type, "RUN_ERROR");
  assert.equal(refused[0].code, "invalid");
  EventSchemas.parse(refused[0]);
  const blocks = await hubRequest("get_context_blocks", { session_id: threadId });
  assert.deepEqual(Object.fromEntries(blocks.map((b) => [b.label, b.content])), { soul: "kind", memory: "likes coffee" });
  assert.equal((await hubRequest("get_history", { session_id: threadId })).length, 2);
});

test("abortRun leaves the run going; POST /agui/{thread}/stop ends it cancelled", { skip }, async () => {
  const threadId = randomUUID();
  const agent = new HttpAgent({ url: `${base}/agui`, threadId });
  agent.messages = [{ id: randomUUID(), role: "user", content: "slow then stop" }];
  let deltas = 0;
  const running = agent
    .runAgent({ runId: randomUUID() }, { onEvent: ({ event }) => { if (event.type === "TEXT_MESSAGE_CONTENT" && ++deltas === 3) agent.abortRun(); } })
    .catch(() => {});
  await running;
  assert.equal(deltas, 3);
  // Closing the POST did not stop it: it is still in flight, and a reader can come back.
  const again = await fetch(`${base}/agui/${threadId}/stream`);
  assert.equal(again.status, 200);
  const reading = readSse(again);
  const stop = await fetch(`${base}/agui/${threadId}/stop`, { method: "POST" });
  assert.equal(stop.status, 200);
  const rest = await reading;
  await checked(rest.map((r) => r.event));
  assert.deepEqual(rest.at(-1).event.outcome, { type: "cancelled" });
  const history = await hubRequest("get_history", { session_id: threadId });
  assert.equal(history.length, 2);
  assert.ok(textOf(history[1]).trim().split(" ").length < 40);
  // Nothing to stop any more: the hub's typed JSON error.
  const none = await fetch(`${base}/agui/${threadId}/stop`, { method: "POST" });
  assert.equal(none.status, 404);
  assert.equal((await none.json()).error.code, "not_found");
});
