// Unit tests of the JS client's protocol state and resume logic, with a fake WebSocket.
// Run: node --test web/test/
import { test } from "node:test";
import assert from "node:assert/strict";
import { ClientConnection, ConnectionLost, HubClient, HubError, LiveMessages, PositionLost, PresenceList, nextBackoff } from "../sessionhub.js";

/** A fake WebSocket: records what the client sends; the test plays the hub. */
class FakeSocket {
  static all = [];
  constructor(url, protocols) {
    this.url = url;
    this.protocols = protocols;
    this.sent = [];
    this.readyState = 0;
    FakeSocket.all.push(this);
  }
  send(data) {
    if (this.readyState !== 1) throw new Error("not open");
    this.sent.push(JSON.parse(data));
  }
  close(code = 1000, reason = "") {
    this.drop(code, reason);
  }
  // -- the hub's side --
  open() {
    this.readyState = 1;
    this.onopen?.({});
  }
  frame(obj) {
    this.onmessage?.({ data: JSON.stringify(obj) });
  }
  drop(code = 1006, reason = "") {
    if (this.readyState === 3) return;
    this.readyState = 3;
    this.onclose?.({ code, reason });
  }
  last(op) {
    return [...this.sent].reverse().find((f) => f.op === op);
  }
}

/** Timers the test fires by hand, recording each delay. */
function manualTimers() {
  const pending = [];
  return {
    pending,
    setTimeout(fn, ms) {
      const t = { fn, ms, done: false };
      pending.push(t);
      return t;
    },
    clearTimeout(t) {
      if (t) t.done = true;
    },
    fireNext() {
      const t = pending.find((x) => !x.done);
      assert.ok(t, "a timer is pending");
      t.done = true;
      t.fn();
      return t.ms;
    },
  };
}

function event(sessionId, seq, type = "message.appended", epoch = "e1") {
  return { frame: "event", stream: "session", session_id: sessionId, seq, epoch, type, data: { seq }, created_at: "" };
}

async function connected(options = {}) {
  FakeSocket.all = [];
  const timers = manualTimers();
  const client = new HubClient("ws://hub/ws", { WebSocket: FakeSocket, timers, random: () => 1, ...options });
  const opening = client.connect();
  FakeSocket.all[0].open();
  await opening;
  return { client, timers, socket: FakeSocket.all[0] };
}

const tick = () => new Promise((r) => setImmediate(r));

test("requests resolve by id, in any order, and errors reject with their code", async () => {
  const { client, socket } = await connected();
  const a = client.request("get", { session_id: "s1" });
  const b = client.request("list");
  await tick();
  const [ra, rb] = socket.sent;
  assert.equal(ra.op, "get");
  assert.notEqual(ra.id, rb.id);
  socket.frame({ frame: "reply", id: rb.id, result: [] });
  socket.frame({ frame: "error", id: ra.id, code: "not_found", message: "no such session" });
  assert.deepEqual(await b, []);
  await assert.rejects(a, (err) => err instanceof HubError && err.code === "not_found");
});

test("a reconnect resubscribes from the last seq and drops duplicates", async () => {
  const { client, timers, socket } = await connected();
  const got = [];
  client.subscribe("s1", { onEvent: (e) => got.push(e.seq) });
  const sub = socket.last("subscribe");
  assert.equal(sub.after_seq, 0);
  socket.frame({ frame: "reply", id: sub.id, result: { epoch: "e1", last_seq: 2 } });
  socket.frame(event("s1", 1));
  socket.frame(event("s1", 2));
  socket.drop(1006, "gone");
  assert.equal(client.state, "reconnecting");
  timers.fireNext();
  const second = FakeSocket.all[1];
  second.open();
  const again = second.last("subscribe");
  assert.equal(again.session_id, "s1");
  assert.equal(again.after_seq, 2);
  assert.equal(again.epoch, "e1");
  second.frame({ frame: "reply", id: again.id, result: { epoch: "e1", last_seq: 3 } });
  second.frame(event("s1", 2)); // a duplicate: already delivered
  second.frame(event("s1", 3));
  assert.deepEqual(got, [1, 2, 3]);
});

test("the subscribe reply's epoch is remembered before the first event", async () => {
  const { client, timers, socket } = await connected();
  client.subscribe(null, { onEvent: () => {} });
  const sub = socket.last("subscribe");
  assert.equal(sub.session_id, null);
  socket.frame({ frame: "reply", id: sub.id, result: { epoch: "E", last_seq: 0 } });
  socket.drop();
  timers.fireNext();
  FakeSocket.all[1].open();
  assert.equal(FakeSocket.all[1].last("subscribe").epoch, "E");
});

test("an event from another epoch is delivered even with a lower seq", () => {
  const c = new ClientConnection();
  c.subscribe("s1", 5, "old");
  const effect = c.receive(JSON.stringify(event("s1", 1, "message.appended", "new")));
  assert.equal(effect.kind, "delivered");
  assert.equal(c.receive(JSON.stringify(event("s1", 1, "x", "new"))).kind, "ignored");
});

test("a reset is surfaced and ends the subscription", async () => {
  const { client, timers, socket } = await connected();
  const resets = [];
  client.subscribe("s1", { afterSeq: 99, onReset: (f) => resets.push(f) });
  socket.frame({ frame: "reset", session_id: "s1", after_seq: 99, epoch: "e1", first_seq: 1, last_seq: 4, message: "beyond the end" });
  assert.equal(resets.length, 1);
  assert.equal(resets[0].last_seq, 4);
  assert.equal(client.subscriptions.size, 0);
  socket.drop();
  timers.fireNext();
  FakeSocket.all[1].open();
  assert.equal(FakeSocket.all[1].last("subscribe"), undefined, "an ended subscription is not resumed");
});

test("an unsubscribed frame is answered by subscribing again from the position, after a pause", async () => {
  const { client, timers, socket } = await connected();
  const got = [];
  client.subscribe("s1", { onEvent: (e) => got.push(e.seq) });
  const first = socket.last("subscribe");
  socket.frame({ frame: "reply", id: first.id, result: { epoch: "e1", last_seq: 9 } });
  socket.frame(event("s1", 1));
  socket.frame(event("s1", 2));
  socket.frame({ frame: "unsubscribed", session_id: "s1", code: "unavailable", message: "postgres unavailable" });
  assert.equal(socket.last("subscribe").id, first.id, "not at once: the database is likely still down");
  assert.equal(timers.fireNext(), 1000);
  const again = socket.last("subscribe");
  assert.notEqual(again.id, first.id);
  assert.equal(again.after_seq, 2);
  assert.equal(again.epoch, "e1");
  socket.frame({ frame: "reply", id: again.id, result: { epoch: "e1", last_seq: 9 } });
  socket.frame(event("s1", 2)); // a duplicate is dropped
  socket.frame(event("s1", 3));
  assert.deepEqual(got, [1, 2, 3]);
});

test("an unsubscribed frame for a stream left meanwhile is not resubscribed", async () => {
  const { client, timers, socket } = await connected();
  const sub = client.subscribe("s1", {});
  socket.frame({ frame: "unsubscribed", session_id: "s1", code: "unavailable", message: "postgres unavailable" });
  const closing = sub.close();
  socket.frame({ frame: "reply", id: socket.last("unsubscribe").id, result: null });
  await closing;
  const sent = socket.sent.length;
  timers.fireNext();
  assert.equal(socket.sent.length, sent);
});

test("with reload, a reset continues from its last_seq by itself", async () => {
  const { client, socket } = await connected();
  const resets = [];
  const got = [];
  client.subscribe("s1", { afterSeq: 99, reload: true, onReset: (f) => resets.push(f), onEvent: (e) => got.push(e.seq) });
  socket.frame({ frame: "reset", session_id: "s1", after_seq: 99, epoch: "e2", first_seq: 1, last_seq: 4, message: "beyond" });
  const again = socket.last("subscribe");
  assert.equal(again.after_seq, 4);
  assert.equal(again.epoch, "e2");
  socket.frame(event("s1", 5, "x", "e2"));
  assert.deepEqual(got, [5]);
  assert.equal(resets.length, 1);
});

test("requests in flight fail with ConnectionLost when the socket drops", async () => {
  const { client, timers, socket } = await connected();
  const pending = client.request("get_history", { session_id: "s1" });
  await tick();
  socket.drop(1001, "server shutting down");
  await assert.rejects(pending, (err) => err instanceof ConnectionLost && /1001/.test(err.message));
  // A late reply for it on the next socket is ignored: it is not resolved twice.
  timers.fireNext();
  FakeSocket.all[1].open();
  FakeSocket.all[1].frame({ frame: "reply", id: socket.sent[0].id, result: [] });
  assert.equal(client.futures.size, 0);
});

test("a request made while reconnecting waits for the socket", async () => {
  const { client, timers, socket } = await connected();
  socket.drop();
  const waiting = client.request("ping");
  timers.fireNext();
  FakeSocket.all[1].open();
  await tick();
  const ping = FakeSocket.all[1].last("ping");
  assert.ok(ping, "sent on the new socket");
  FakeSocket.all[1].frame({ frame: "reply", id: ping.id, result: "pong" });
  assert.equal(await waiting, "pong");
});

test("backoff doubles from the first step up to the cap, and resets after a stable connection", async () => {
  assert.equal(nextBackoff(0, 50, 5000), 50);
  assert.equal(nextBackoff(50, 50, 5000), 100);
  assert.equal(nextBackoff(4000, 50, 5000), 5000);
  const { client, timers, socket } = await connected({ firstBackoff: 100, maxBackoff: 800, stableAfter: 60_000 });
  const states = [];
  client.on("state", (s) => states.push(s));
  socket.drop();
  const delays = [];
  for (let i = 0; i < 5; i++) {
    delays.push(timers.fireNext());
    FakeSocket.all.at(-1).drop(); // the hub is still down
  }
  assert.deepEqual(delays, [100, 200, 400, 800, 800]);
  assert.ok(states.every((s) => s.state === "reconnecting"));
  assert.equal(states.at(-1).attempt, 6);
  // A connection that stays up past stableAfter reconnects at once after the next drop.
  client.stableAfter = 0;
  timers.fireNext();
  FakeSocket.all.at(-1).open();
  assert.equal(client.state, "open");
  FakeSocket.all.at(-1).drop();
  assert.equal(timers.fireNext(), 0);
});

test("the token travels as subprotocols, never in the URL", async () => {
  const { socket } = await connected({ token: "SECRET" });
  assert.deepEqual(socket.protocols, ["sessionhub", "bearer.SECRET"]);
  assert.ok(!socket.url.includes("SECRET"));
});

test("hello is sent on every (re)connect when a name is given", async () => {
  const { timers, socket } = await connected({ name: "ui", role: "observer" });
  assert.equal(socket.sent[0].op, "hello");
  assert.equal(socket.sent[0].name, "ui");
  socket.drop();
  timers.fireNext();
  FakeSocket.all[1].open();
  assert.equal(FakeSocket.all[1].sent[0].op, "hello");
});

test("a refused subscription calls onError and is not resumed", async () => {
  const { client, timers, socket } = await connected();
  const errors = [];
  client.subscribe(null, { onError: (e) => errors.push(e) });
  const sub = socket.last("subscribe");
  socket.frame({ frame: "error", id: sub.id, code: "forbidden", message: "forbidden" });
  assert.equal(errors[0].code, "forbidden");
  socket.drop();
  timers.fireNext();
  FakeSocket.all[1].open();
  assert.equal(FakeSocket.all[1].last("subscribe"), undefined);
});

test("close() stops reconnecting and fails requests", async () => {
  const { client, timers, socket } = await connected();
  const pending = client.request("ping");
  await tick();
  client.close();
  await assert.rejects(pending, ConnectionLost);
  await assert.rejects(client.request("ping"), ConnectionLost);
  assert.equal(client.state, "closed");
  assert.equal(timers.pending.filter((t) => !t.done).length, 0);
  assert.equal(socket.readyState, 3);
});

test("LiveMessages applies each delta once, in order, after the state it follows", () => {
  const live = new LiveMessages();
  const m = { id: "m", role: "assistant", parts: [] };
  live.apply({ message_id: "m", action: "delta", index: 3, deltas: [{ index: 3, kind: "text", text: "c" }] });
  live.apply({ message_id: "m", action: "state", index: 1, message: { ...m, parts: [{ type: "text", text: "a" }] } });
  live.apply({ message_id: "m", action: "delta", index: 2, deltas: [{ index: 1, kind: "text", text: "a" }, { index: 2, kind: "text", text: "b" }] });
  assert.equal(live.messages.get("m").parts[0].text, "abc");
  live.apply({ message_id: "m", action: "delta", index: 4, deltas: [{ index: 4, kind: "tool", part: { type: "tool-x", toolCallId: "c1", state: "input-available" } }] });
  live.apply({ message_id: "m", action: "delta", index: 5, deltas: [{ index: 5, kind: "tool", part: { type: "tool-x", toolCallId: "c1", state: "output-available" } }] });
  assert.equal(live.messages.get("m").parts.length, 2);
  assert.equal(live.messages.get("m").parts[1].state, "output-available");
  live.applyEvent({ type: "stream.ended", data: { message_id: "m", status: "finished", deltas: 5 } });
  assert.equal(live.status.get("m"), "finished");
});

test("PresenceList folds the presence reply and frames, with what each connection streams", () => {
  const list = new PresenceList("s1");
  list.reset([{ connection_id: "c1", name: "dash", role: "observer" }]); // an older hub: no streaming
  assert.deepEqual([...list.values()], [{ connection_id: "c1", name: "dash", role: "observer", streaming: [] }]);
  const writer = { connection_id: "c2", name: "writer-1", role: "worker", streaming: ["m-42"] };
  assert.equal(list.apply({ frame: "presence", session_id: "s1", action: "join", entry: writer }), true);
  assert.deepEqual([...list.streaming()], [["m-42", writer]]);
  // A join for a present connection replaces its entry: a second stream, then one ended.
  list.apply({ frame: "presence", session_id: "s1", action: "join", entry: { ...writer, streaming: ["m-42", "m-43"] } });
  assert.deepEqual([...list.streaming().keys()], ["m-42", "m-43"]);
  list.apply({ frame: "presence", session_id: "s1", action: "join", entry: { ...writer, streaming: ["m-43"] } });
  assert.deepEqual([...list.streaming().keys()], ["m-43"]);
  assert.equal(list.size, 2);
  // Another session's frame changes nothing here.
  assert.equal(list.apply({ frame: "presence", session_id: "s2", action: "leave", entry: writer }), false);
  assert.equal(list.size, 2);
  list.apply({ frame: "presence", session_id: "s1", action: "leave", entry: { ...writer, streaming: [] } });
  assert.deepEqual([...list.values()].map((e) => e.name), ["dash"]);
  assert.equal(list.streaming().size, 0);
});

/** Answer the last `op` request on `socket` with `result` (or an error frame). */
async function answer(socket, op, reply) {
  await tick();
  const req = socket.last(op);
  assert.ok(req, `a ${op} request was sent`);
  socket.frame({ id: req.id, ...reply });
  return req;
}

test("readEvents and readRegistryEvents send read_events and resolve with the events", async () => {
  const { client, socket } = await connected();
  const logged = [{ stream: "session", session_id: "s1", seq: 3, epoch: "e1", type: "message.appended", data: {}, created_at: "" }];
  const reading = client.readEvents("s1", { afterSeq: 2, limit: 10 });
  const req = await answer(socket, "read_events", { frame: "reply", result: logged });
  assert.deepEqual([req.session_id, req.after_seq, req.limit], ["s1", 2, 10]);
  assert.deepEqual(await reading, logged);
  const registry = client.readRegistryEvents();
  const reg = await answer(socket, "read_events", { frame: "reply", result: [] });
  assert.deepEqual([reg.session_id, reg.after_seq, reg.limit], [null, 0, 1000]); // Python's defaults
  assert.deepEqual(await registry, []);
});

test("a read of a lost position rejects with PositionLost; other errors stay HubErrors", async () => {
  const { client, socket } = await connected();
  const detail = { stream: "s1", after_seq: 2, epoch: "e1", first_seq: 5, last_seq: 9 };
  const reading = client.readEvents("s1", { afterSeq: 2 });
  await answer(socket, "read_events", { frame: "error", code: "not_found", message: "pruned", detail });
  await assert.rejects(reading, (err) => {
    assert.ok(err instanceof PositionLost && err instanceof HubError);
    assert.deepEqual([err.code, err.epoch, err.firstSeq, err.lastSeq, err.detail], ["reset", "e1", 5, 9, detail]);
    assert.deepEqual([err.frame.session_id, err.frame.after_seq], ["s1", 2]); // as a reset frame has them
    return true;
  });
  const registry = client.readRegistryEvents({ afterSeq: 1 });
  await answer(socket, "read_events", { frame: "error", code: "not_found", message: "pruned", detail: { ...detail, stream: "registry" } });
  await assert.rejects(registry, (err) => err instanceof PositionLost && err.frame.session_id === null);
  const unknown = client.readEvents("nope");
  await answer(socket, "read_events", { frame: "error", code: "not_found", message: "session not found", detail: { session_id: "nope" } });
  await assert.rejects(unknown, (err) => !(err instanceof PositionLost) && err.code === "not_found" && err.detail.session_id === "nope");
});

test("estimateTokens sends the leaf and resolves with the integer", async () => {
  const { client, socket } = await connected();
  const estimating = client.estimateTokens("s1", { leafId: "m7" });
  const req = await answer(socket, "estimate_tokens", { frame: "reply", result: 412 });
  assert.deepEqual([req.session_id, req.leaf_id], ["s1", "m7"]);
  assert.equal(await estimating, 412);
  const latest = client.estimateTokens("s1");
  assert.equal((await answer(socket, "estimate_tokens", { frame: "reply", result: "lots" })).leaf_id, null);
  await assert.rejects(latest, (err) => err instanceof HubError && err.code === "internal");
});

test("pruneEvents sends an age, a time or neither, and resolves with what was pruned", async () => {
  const { client, socket } = await connected();
  const byAge = client.pruneEvents({ olderThan: 3600, keepPerSession: 50 });
  const req = await answer(socket, "prune_events", { frame: "reply", result: { events: 12, streams: 2 } });
  assert.deepEqual([req.older_than, req.keep_per_session, req.batch], [3600, 50, 1000]);
  assert.deepEqual(await byAge, { events: 12, streams: 2 });
  const byTime = client.pruneEvents({ olderThan: new Date("2026-01-02T03:04:05Z"), batch: 10 });
  const timed = await answer(socket, "prune_events", { frame: "reply", result: { events: 0, streams: 0 } });
  assert.deepEqual([timed.older_than, timed.keep_per_session, timed.batch], ["2026-01-02T03:04:05.000Z", null, 10]);
  await byTime;
  const refused = client.pruneEvents({ keepPerSession: 1 });
  await answer(socket, "prune_events", { frame: "error", code: "forbidden", message: "needs admin on *" });
  await assert.rejects(refused, (err) => err instanceof HubError && err.code === "forbidden");
});

test("bad arguments reject with HubError invalid and send nothing", async () => {
  const { client, socket } = await connected();
  const before = socket.sent.length;
  for (const olderThan of [Number.NaN, Infinity, new Date("not a date"), { hours: 1 }]) {
    await assert.rejects(client.pruneEvents({ olderThan }), (err) => err instanceof HubError && err.code === "invalid");
  }
  // A bare after_seq, as in Python's read_events(5), is not taken for "no options".
  await assert.rejects(client.readEvents("s1", 5), (err) => err instanceof HubError && err.code === "invalid");
  await assert.rejects(client.readRegistryEvents(5), (err) => err.code === "invalid");
  await assert.rejects(client.estimateTokens("s1", "m7"), (err) => err.code === "invalid");
  await tick();
  assert.equal(socket.sent.length, before);
});

test("a socket closed as it opens (a draining hub) is one more attempt, on the next URL", async () => {
  FakeSocket.all = [];
  const timers = manualTimers();
  const client = new HubClient(["ws://a/ws", "ws://b/ws"], { WebSocket: FakeSocket, timers, random: () => 1, name: "ui" });
  let settled = false;
  const opening = client.connect().finally(() => (settled = true));
  const draining = FakeSocket.all[0];
  assert.equal(draining.url, "ws://a/ws");
  draining.readyState = 2; // its 1001 came with the handshake: the hello cannot go out
  draining.onopen({});
  draining.drop(1001, "server shutting down; resume elsewhere");
  await tick();
  assert.equal(settled, false, "connect() goes on to the next URL");
  assert.equal(client.state, "reconnecting");
  timers.fireNext();
  const live = FakeSocket.all[1];
  assert.equal(live.url, "ws://b/ws");
  live.open();
  await opening;
  assert.equal(live.sent[0].op, "hello");
  assert.equal(client.url, "ws://b/ws");
  assert.equal(client.reconnects, 0, "still the first connection");
});

test("any close is retried, round robin over the URLs, and the subscriptions resume", async () => {
  FakeSocket.all = [];
  const timers = manualTimers();
  const client = new HubClient(["ws://a/ws", "ws://b/ws"], { WebSocket: FakeSocket, timers, random: () => 1, name: "ui" });
  const opening = client.connect();
  FakeSocket.all[0].open();
  await opening;
  const seen = [];
  client.subscribe("s1", { onEvent: (e) => seen.push(e.seq) });
  FakeSocket.all[0].frame(event("s1", 1));
  const urls = [];
  for (const code of [1001, 1012, 1011, 4008, 1006]) {
    FakeSocket.all.at(-1).drop(code, "going");
    timers.fireNext();
    urls.push(FakeSocket.all.at(-1).url);
  }
  assert.deepEqual(urls, ["ws://b/ws", "ws://a/ws", "ws://b/ws", "ws://a/ws", "ws://b/ws"]);
  const last = FakeSocket.all.at(-1);
  last.open();
  assert.deepEqual(last.sent.map((f) => f.op), ["hello", "subscribe"]);
  assert.equal(last.last("subscribe").after_seq, 1);
  last.frame(event("s1", 1));
  last.frame(event("s1", 2));
  assert.deepEqual(seen, [1, 2]);
  assert.equal(client.reconnects, 1);
  client.close();
});

test("connect() rejects once every URL failed; bad URLs are refused at once", async () => {
  FakeSocket.all = [];
  const timers = manualTimers();
  const client = new HubClient(["ws://a/ws", "ws://b/ws"], { WebSocket: FakeSocket, timers, random: () => 1 });
  const opening = client.connect();
  FakeSocket.all[0].drop(1006);
  timers.fireNext();
  FakeSocket.all[1].drop(1006);
  await assert.rejects(opening, ConnectionLost);
  client.close();
  for (const bad of [[], "", ["ws://a/ws", 7], null]) {
    assert.throws(() => new HubClient(bad, { WebSocket: FakeSocket }), (e) => e instanceof HubError && e.code === "invalid");
  }
});

test("without reconnect, connect() still tries each URL once; close() settles a pending connect()", async () => {
  FakeSocket.all = [];
  const timers = manualTimers();
  const once = new HubClient(["ws://a/ws", "ws://b/ws"], { WebSocket: FakeSocket, timers, random: () => 1, reconnect: false });
  const first = once.connect();
  FakeSocket.all[0].drop(1001);
  timers.fireNext();
  assert.equal(FakeSocket.all[1].url, "ws://b/ws");
  FakeSocket.all[1].drop(1001);
  await assert.rejects(first, ConnectionLost);
  assert.equal(once.state, "closed");
  assert.equal(timers.pending.filter((t) => !t.done).length, 0, "no retry after the last URL");

  const closing = new HubClient(["ws://a/ws", "ws://b/ws"], { WebSocket: FakeSocket, timers, random: () => 1 });
  const second = closing.connect();
  FakeSocket.all.at(-1).drop(1006);
  closing.close();
  await assert.rejects(second, ConnectionLost);
});

test("a second subscription to one stream (the registry too) throws HubError invalid", async () => {
  const { client } = await connected();
  client.subscribe(null);
  client.subscribe("s1");
  assert.throws(() => client.subscribe(null), (err) => err instanceof HubError && err.code === "invalid" && /the registry/.test(err.message));
  assert.throws(() => client.subscribe("s1"), (err) => err instanceof HubError && /"?s1/.test(err.message));
});

test("renew ends the subscriptions the new token does not cover, the registry's included", async () => {
  const { client, socket } = await connected();
  const errors = [];
  client.subscribe(null, { onError: (err) => errors.push(err) });
  client.subscribe("s1", { onError: (err) => errors.push(err) });
  const renewing = client.renew("t2");
  await tick();
  socket.frame({ frame: "reply", id: socket.last("auth").id, result: { sub: "u", exp: null, ended: [null] } });
  assert.deepEqual((await renewing).ended, [null]);
  assert.equal(errors.length, 1);
  assert.ok(errors[0] instanceof HubError && errors[0].code === "forbidden" && /the registry/.test(errors[0].message));
});
