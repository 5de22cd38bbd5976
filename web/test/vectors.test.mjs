// The shared protocol vectors (tests/vectors/*.json) against sessionhub.js: its
// ClientConnection, error decoding and delta application. tests/protocol/test_vectors.py runs the
// same files against the Python side, so the two clients cannot drift apart unnoticed.
// Run: node --test web/test/
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { ClientConnection, ConnectionLost, LiveMessages, applyDelta, errorFrom, HubError } from "../sessionhub.js";

const load = (name) => JSON.parse(readFileSync(new URL(`../../tests/vectors/${name}.json`, import.meta.url), "utf8"));
const sent = (data) => (data === null || data === undefined ? null : JSON.parse(data));
const REGISTRY = "\u0000registry"; // sessionhub.js's key for the registry stream
const streamOf = (key) => (key === REGISTRY ? null : key);

/** The effect as the vectors spell it (tests/protocol/test_vectors.py builds the same). */
function canonical(effect) {
  switch (effect.kind) {
    case "resolved":
      return { kind: "resolved", id: effect.id, result: effect.result ?? null };
    case "failed":
      return { kind: "failed", id: effect.id, code: effect.code, message: effect.message, detail: effect.detail };
    case "subscribed":
      return { kind: "subscribed", session_id: streamOf(effect.key), result: effect.result ?? null };
    case "subscribe_failed": {
      const { id, code, message, detail } = effect;
      return { kind: "subscribe_failed", session_id: streamOf(effect.key), id, code, message, detail };
    }
    case "delivered":
      return { kind: "delivered", session_id: streamOf(effect.key), seq: effect.event.seq, epoch: effect.event.epoch };
    case "reset":
      return {
        kind: "reset",
        session_id: streamOf(effect.key),
        epoch: effect.frame.epoch,
        last_seq: effect.frame.last_seq,
        resubscribe: effect.resubscribe === null ? null : sent(effect.resubscribe[1]),
      };
    case "unsubscribed":
      return { kind: "unsubscribed", session_id: streamOf(effect.key), code: effect.frame.code };
    case "ignored":
      return { kind: "ignored", reason: effect.reason };
    case "stream":
      return { kind: "stream", message_id: effect.frame.message_id, action: effect.frame.action, index: effect.frame.index };
    case "presence":
      return { kind: "presence", session_id: effect.frame.session_id, action: effect.frame.action };
    case "summarize":
      return { kind: "summarize", request_id: effect.frame.request_id };
    default:
      throw new Error(`unknown effect ${effect.kind}`);
  }
}

function call(conn, step) {
  switch (step.do) {
    case "subscribe":
      return sent(conn.subscribe(step.session_id, step.after_seq ?? 0, step.epoch ?? null, !!step.presence, !!step.reload)[1]);
    case "unsubscribe":
      return sent(conn.unsubscribe(step.session_id)[1]);
    case "request":
      return sent(conn.request(step.op, step.fields)[1]);
    case "resubscribe":
      return conn.resubscribe().map(([, , data]) => sent(data));
    case "abandon":
      conn.abandon(step.id);
      return null;
    case "hello":
      return sent(conn.hello(step.name ?? null, step.role ?? null, step.sessions ?? [], !!step.summarizer));
    case "summary":
      return sent(conn.summary(step.request_id, step.summary ?? null, step.error ?? null));
    case "position": {
      const p = conn.positions.get(step.session_id === null ? REGISTRY : step.session_id);
      return p ? { epoch: p.epoch, seq: p.seq } : null;
    }
    default:
      throw new Error(`unknown step ${step.do}`);
  }
}

for (const c of load("connection").cases) {
  test(`connection: ${c.name}`, () => {
    const conn = new ClientConnection();
    c.steps.forEach((step, n) => {
      const where = `step ${n}: ${JSON.stringify(step)}`;
      if ("receive" in step) assert.deepEqual(canonical(conn.receive(JSON.stringify(step.receive))), step.effect, where);
      else if (step.do === "position") assert.deepEqual(call(conn, step), step.is, where);
      else assert.deepEqual(call(conn, step), step.sends ?? null, where);
    });
  });
}

const errors = load("errors");
for (const c of errors.cases) {
  test(`errors: ${c.frame.message}`, () => {
    const effect = new ClientConnection().receive(JSON.stringify(c.frame));
    assert.equal(effect.kind, "failed");
    const error = errorFrom(effect);
    assert.equal(error.name, c.type.js);
    assert.deepEqual({ code: error.code, message: error.message, detail: error.detail }, c.error);
  });
}

test("errors: a lost connection", () => {
  const error = new ConnectionLost();
  assert.equal(error.name, errors.lost.type.js);
  assert.deepEqual([error.code, error.message], [errors.lost.code, errors.lost.message]);
});

const deltas = load("deltas");
for (const c of deltas.apply) {
  test(`apply delta: ${c.name}`, () => {
    const parts = structuredClone(c.parts);
    const run = () => applyDelta(parts, c.delta.kind, c.delta.text, c.delta.part);
    if (c.invalid) assert.throws(run, (err) => err instanceof HubError && err.code === "invalid");
    else run();
    assert.deepEqual(parts, c.after);
  });
}

for (const c of deltas.live) {
  test(`live messages: ${c.name}`, () => {
    const live = new LiveMessages();
    c.feed.forEach((step, n) => {
      if ("frame" in step) live.apply(structuredClone(step.frame));
      else if ("event" in step) live.applyEvent(structuredClone(step.event));
      else {
        const held = {
          message: live.messages.get("m") ?? null,
          status: live.status.get("m") ?? null,
          index: live.index.get("m") ?? null,
        };
        assert.deepEqual(held, step.expect, `step ${n}`);
      }
    });
  });
}
