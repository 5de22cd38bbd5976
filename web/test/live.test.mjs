// The JS client against a real hub: tests/test_web_client.py starts one and sets
// SESSIONHUB_WS_URL (skipped otherwise). Node 20 needs --experimental-websocket.
import { test } from "node:test";
import assert from "node:assert/strict";
import { HubClient, HubError } from "../sessionhub.js";

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
