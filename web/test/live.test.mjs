// The JS client against a real hub: tests/web/test_web_client.py starts one and sets
// SESSIONHUB_WS_URL (skipped otherwise). Node 20 needs --experimental-websocket.
import { test } from "node:test";
import assert from "node:assert/strict";
import { HubClient, HubError, PositionLost } from "../sessionhub.js";

const url = process.env.SESSIONHUB_WS_URL;
const skip = !url || typeof WebSocket !== "function" ? "needs SESSIONHUB_WS_URL and a global WebSocket" : false;

function waitFor(predicate, what, ms = 5000) {
  return new Promise((resolve, reject) => {
    const started = Date.now();
    const poll = () => {
      if (predicate()) resolve();
      else if (Date.now() - started > ms) reject(new Error(`timed out waiting for ${what}`));
      else setTimeout(poll, 10);
    };
    poll();
  });
}

test("requests, typed errors, and a subscription that resumes after a drop", { skip }, async () => {
  const reader = new HubClient(url, { name: "node-reader", firstBackoff: 20 });
  const writer = new HubClient(url);
  await reader.connect();
  await writer.connect();
  try {
    assert.equal(await writer.ping(), "pong");
    const info = await writer.request("create", { name: "from-node" });
    await assert.rejects(writer.request("rename", { session_id: "nope", name: "x" }), (e) => e instanceof HubError && e.code === "not_found");
    await assert.rejects(writer.request("no_such_op"), (e) => e.code === "unknown_op");

    const seqs = [];
    const appended = [];
    reader.subscribe(info.id, {
      onEvent: (e) => {
        seqs.push(e.seq);
        if (e.type === "message.appended") appended.push(e.data.message.id);
      },
    });
    const say = (id) => writer.request("append", { session_id: info.id, message: { id, role: "user", parts: [{ type: "text", text: id }] } });
    await say("m1");
    await say("m2");
    await waitFor(() => appended.length === 2, "the first two events");

    // Drop the reader's socket; write while it is away; it resumes from its last seq.
    const reconnected = new Promise((resolve) => reader.on("reconnect", resolve));
    reader.socket.close();
    await say("m3");
    await reconnected;
    await say("m4");
    await waitFor(() => appended.length === 4, "the events after the drop");
    assert.deepEqual(appended, ["m1", "m2", "m3", "m4"]);
    assert.deepEqual(seqs, [...seqs].sort((a, b) => a - b));
    assert.equal(new Set(seqs).size, seqs.length, "no event delivered twice");

    // Presence: the reader is on the session while it subscribes.
    const present = await writer.presence(info.id);
    assert.ok(present.some((p) => p.name === "node-reader"));

    // A streamed message, as a worker writes it.
    const frames = [];
    reader.on("stream", (f) => frames.push(f));
    const st = await writer.streamMessage(info.id, "s1");
    st.text("Hel");
    // Presence says which connection streams it (the writer, not the reader), then stops.
    const streamers = async () => (await reader.presence(info.id)).filter((p) => p.streaming.includes("s1"));
    const during = await streamers();
    assert.equal(during.length, 1);
    assert.notEqual(during[0].name, "node-reader");
    st.text("lo");
    await st.end();
    assert.deepEqual(await streamers(), []);
    const history = await writer.request("get_history", { session_id: info.id });
    assert.deepEqual(history.at(-1).parts, [{ type: "text", text: "Hello" }]);
    await waitFor(() => frames.some((f) => f.action === "end"), "the stream's end frame");
  } finally {
    reader.close();
    writer.close();
  }
});

test("event log reads, the token estimate and pruning, against the hub", { skip }, async () => {
  const hub = new HubClient(url);
  await hub.connect();
  try {
    const info = await hub.request("create", { name: "logs-from-node" });
    for (const id of ["m1", "m2", "m3"]) {
      await hub.request("append", { session_id: info.id, message: { id, role: "user", parts: [{ type: "text", text: `${id} `.repeat(40) }] } });
    }
    const all = await hub.readEvents(info.id);
    const appended = all.filter((e) => e.type === "message.appended").map((e) => e.data.message.id);
    assert.deepEqual(appended, ["m1", "m2", "m3"]);
    assert.deepEqual(all.map((e) => e.seq), [...all.map((e) => e.seq)].sort((a, b) => a - b));
    const last = all.at(-1).seq;
    const after = await hub.readEvents(info.id, { afterSeq: all[0].seq, limit: 2 });
    assert.deepEqual(after.map((e) => e.seq), [all[1].seq, all[2].seq]);
    await assert.rejects(hub.readEvents(info.id, { afterSeq: last + 5 }), (e) => e instanceof PositionLost && e.lastSeq === last);
    await assert.rejects(hub.readEvents(info.id, { limit: 10_001 }), (e) => e instanceof HubError && e.code === "invalid");
    await assert.rejects(hub.readEvents("no-such-session"), (e) => e.code === "not_found" && !(e instanceof PositionLost));
    const created = (await hub.readRegistryEvents()).filter((e) => e.session_id === info.id);
    assert.equal(created[0].stream, "registry");

    // The estimate grows with the branch; a shorter one (leafId) is estimated lower.
    const whole = await hub.estimateTokens(info.id);
    const first = await hub.estimateTokens(info.id, { leafId: "m1" });
    assert.ok(Number.isInteger(whole) && whole > first && first > 0, `${whole} > ${first} > 0`);
    await assert.rejects(hub.estimateTokens("no-such-session"), (e) => e instanceof HubError && e.code === "not_found");

    // Pruning to one event per log: the session's old events are gone, and a read of them
    // says where the log now starts.
    const pruned = await hub.pruneEvents({ keepPerSession: 1 });
    assert.ok(pruned.events >= all.length - 1 && pruned.streams >= 1, JSON.stringify(pruned));
    await assert.rejects(hub.readEvents(info.id), (e) => e instanceof PositionLost && e.firstSeq === last && e.lastSeq === last);
    assert.deepEqual((await hub.readEvents(info.id, { afterSeq: last - 1 })).map((e) => e.seq), [last]);
    await assert.rejects(hub.pruneEvents({ olderThan: -1 }), (e) => e instanceof HubError && e.code === "invalid");
  } finally {
    hub.close();
  }
});

const draining = process.env.SESSIONHUB_DRAINING_WS_URL;
const skipFailover = skip || (!draining ? "needs SESSIONHUB_DRAINING_WS_URL (a hub that is shutting down)" : false);

test("given a draining hub's URL and a live one, a named client fails over and resumes", { skip: skipFailover }, async () => {
  // The draining hub accepts each socket and closes it with 1001: every attempt there fails.
  const reader = new HubClient([draining, url], { name: "node-failover", firstBackoff: 20, maxBackoff: 200 });
  const writer = new HubClient(url);
  const closes = [];
  reader.on("state", (s) => s.state === "reconnecting" && closes.push(s.reason));
  await reader.connect();
  await writer.connect();
  try {
    const info = await writer.request("create", { name: "failover-from-node" });
    const appended = [];
    const seqs = [];
    reader.subscribe(info.id, {
      onEvent: (e) => {
        seqs.push(e.seq);
        if (e.type === "message.appended") appended.push(e.data.message.id);
      },
    });
    const say = (id) => writer.request("append", { session_id: info.id, message: { id, role: "user", parts: [] } });
    await say("m1");
    await waitFor(() => appended.length === 1, "the first event, on the live hub");
    assert.equal(reader.url, url);
    // Dropped by the live hub: the next attempt meets the draining one, then back here.
    const before = reader.reconnects;
    reader.socket.close();
    await say("m2");
    await waitFor(() => appended.length === 2 && reader.reconnects > before, "the event after the failover");
    assert.equal(reader.url, url);
    assert.ok(closes.some((r) => r.startsWith("1001")), `a 1001 was met and retried: ${closes}`);
    assert.deepEqual(appended, ["m1", "m2"]);
    assert.deepEqual(seqs, [...seqs].sort((a, b) => a - b));
    assert.equal(new Set(seqs).size, seqs.length, "no event delivered twice");
    assert.equal(await reader.ping(), "pong");
  } finally {
    reader.close();
    writer.close();
  }
});

const full = process.env.SESSIONHUB_FULL_WS_URL;
const skipFull = skip || (!full ? "needs SESSIONHUB_FULL_WS_URL (a hub at its connection limit)" : false);

test("a hub at its connection limit: a request's error is one line naming the limit", { skip: skipFull }, async () => {
  // The full hub accepts each socket and closes it with 1013 (hub/server/admission.py).
  const client = new HubClient(full, { firstBackoff: 20, maxBackoff: 50, openTimeout: 500 });
  const closes = [];
  client.on("state", (s) => s.state === "reconnecting" && closes.push(s.reason));
  try {
    await client.connect().catch(() => {});
    let error;
    for (let i = 0; i < 50 && !error; i++) {
      try {
        await client.ping();
      } catch (err) {
        error = err;
      }
    }
    assert.ok(error, "a request at a full hub fails");
    assert.equal(error.name, "ConnectionLost");
    assert.ok(!error.message.includes("\n"), error.message);
    assert.match(error.message, /1013: the hub is at its connection limit/);
    assert.ok(closes.some((r) => r.startsWith("1013")), `1013 met and retried: ${closes}`);
  } finally {
    client.close();
  }
});
