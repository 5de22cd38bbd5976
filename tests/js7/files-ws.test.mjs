// Files through the real AI SDK 7 (ai 7.x, Node 22): tests/js/files.test.mjs over the AI SDK
// 7 WebSocketChatTransport (/api/chat/ws) instead of HTTP. tests/adapters/test_files_http.py
// starts the hub and a responder, writes the image to SESSIONHUB_IMAGE and checks the store
// afterwards (one copy for both chats). Here: the stored message keeps a /files/{sha256} reference with
// the filename and media type, and GET /files/... gives back the very bytes.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { AbstractChat, WebSocketChatTransport } from "ai";
import { HubClient } from "../../web/sessionhub.js";

const base = process.env.SESSIONHUB_URL;
const wsUrl = process.env.SESSIONHUB_WS_URL;
const imagePath = process.env.SESSIONHUB_IMAGE;
const skip = !base || !imagePath ? "needs SESSIONHUB_URL and SESSIONHUB_IMAGE" : false;

/** The state @ai-sdk/react's Chat keeps, without React. */
class State {
  status = "ready";
  error = undefined;
  messages = [];
  pushMessage = (m) => { this.messages = this.messages.concat(m); };
  popMessage = () => { this.messages = this.messages.slice(0, -1); };
  replaceMessage = (i, m) => { this.messages = [...this.messages.slice(0, i), m, ...this.messages.slice(i + 1)]; };
  snapshot = (thing) => structuredClone(thing);
}

class Chat extends AbstractChat {
  constructor(init) {
    super({ ...init, state: new State() });
  }
  get all() {
    return this.state.messages;
  }
}

async function stored(sessionId, messageId) {
  const hub = new HubClient(wsUrl);
  await hub.connect();
  try {
    return await hub.request("get_message", { session_id: sessionId, message_id: messageId });
  } finally {
    hub.close();
  }
}

for (const name of ["first chat", "second chat"]) {
  test(`${name} over /api/chat/ws: sendMessage({ files }) stores the file once and /files gives back its bytes`, { skip }, async () => {
    const image = readFileSync(imagePath);
    const sha = createHash("sha256").update(image).digest("hex");
    const url = `data:image/png;base64,${image.toString("base64")}`;
    const transport = new WebSocketChatTransport({ url: `${base.replace(/^http/, "ws")}/api/chat/ws` });
    const chat = new Chat({ id: randomUUID(), transport });
    await chat.sendMessage({
      text: "what is in this picture?",
      files: [{ type: "file", mediaType: "image/png", filename: "pixel.png", url }],
    });
    assert.equal(chat.status, "ready", String(chat.error));
    const [sent, reply] = chat.all;
    assert.equal(reply.role, "assistant");
    const message = await stored(chat.id, sent.id);
    const file = message.parts.find((p) => p.type === "file");
    assert.deepEqual(file, { type: "file", mediaType: "image/png", filename: "pixel.png", url: `/files/${sha}` });
    const got = await fetch(`${base}${file.url}`);
    assert.equal(got.status, 200);
    assert.equal(got.headers.get("content-type"), "image/png");
    assert.equal(got.headers.get("etag"), `"${sha}"`);
    assert.ok(Buffer.from(await got.arrayBuffer()).equals(image), "the same bytes");
    transport.close();
  });
}
