// presence.js: who is on one session, folded from the `presence` reply and presence frames.
// Import it from sessionhub.js, which re-exports it: it is a reader's view, not part of the
// connection, so it lives apart and sessionhub.js stays the wire protocol.

/**
 * Who is on one session, as a reader sees it: reset(entries) with the `presence` reply, then
 * apply(frame) with each presence frame (frames of other sessions are ignored). A join adds
 * the connection or replaces its entry (a new name or role, a stream started or ended), a
 * leave removes it. Entries are {connection_id, name, role, streaming: [message id]}, as
 * the hub sends them (an older hub's entry without `streaming` reads as streaming nothing).
 */
export class PresenceList {
  constructor(sessionId) {
    this.sessionId = sessionId;
    this.entries = new Map(); // connection id -> entry
  }

  static entry(e) {
    return { ...e, streaming: Array.isArray(e.streaming) ? e.streaming : [] };
  }

  reset(entries) {
    this.entries = new Map(entries.map((e) => [e.connection_id, PresenceList.entry(e)]));
  }

  /** Returns whether the frame was about this session (and so may have changed the list). */
  apply(frame) {
    if (frame.session_id !== this.sessionId) return false;
    if (frame.action === "leave") this.entries.delete(frame.entry.connection_id);
    else this.entries.set(frame.entry.connection_id, PresenceList.entry(frame.entry));
    return true;
  }

  clear() {
    this.entries.clear();
  }

  get size() {
    return this.entries.size;
  }

  values() {
    return this.entries.values();
  }

  /** Message id -> the entry of the connection streaming it. */
  streaming() {
    const out = new Map();
    for (const e of this.entries.values()) for (const id of e.streaming) out.set(id, e);
    return out;
  }
}
