// The errors the client raises: HubError (an error frame's code, message and detail),
// ConnectionLost (the socket went: the request may or may not have run), PositionLost (a
// subscription position the log cannot serve), and errorFrom, which rebuilds one from a frame.

/**
 * Error frames become HubError: `code` is the wire code (invalid, not_found, forbidden...),
 * `detail` the frame's structured detail ({session_id} for an unknown session, {field,
 * problem} for an invalid message) or null.
 */
export class HubError extends Error {
  constructor(code, message, detail = null) {
    super(message);
    this.name = "HubError";
    this.code = code;
    this.detail = detail ?? null;
  }
}

/** The code of ConnectionLost: a wire code (the same as the Python client's), not a new one. */
export const CONNECTION_LOST_CODE = "unavailable";

/** The socket dropped before the reply came (or the client is closed). Code `unavailable`. */
export class ConnectionLost extends HubError {
  constructor(message = "the connection to the hub was lost") {
    super(CONNECTION_LOST_CODE, message);
    this.name = "ConnectionLost";
  }
}

/**
 * The error an error frame (or a failed effect: {code, message, detail}) stands for: a
 * PositionLost for a `not_found` carrying a position (a `read_events` of a lost position),
 * as the Python client rebuilds it from the same detail; else a HubError.
 */
export function errorFrom({ code, message, detail }) {
  const d = detail ?? null;
  const seqs = d ? [d.after_seq, d.first_seq, d.last_seq] : [];
  if (code === "not_found" && typeof d?.stream === "string" && typeof d.epoch === "string" && seqs.every(Number.isInteger)) {
    const sessionId = d.stream === "registry" ? null : d.stream;
    const [after_seq, first_seq, last_seq] = seqs;
    return new PositionLost({ frame: "reset", session_id: sessionId, after_seq, epoch: d.epoch, first_seq, last_seq, message });
  }
  return new HubError(code, message, d);
}

/**
 * A position the event log cannot serve (pruned, another epoch, beyond the end): a
 * subscription's `reset` frame, or a `readEvents` refused for it. `frame` is the reset frame
 * (one is made up for a read); reload a snapshot and go on from `lastSeq` in `epoch`.
 */
export class PositionLost extends HubError {
  constructor(frame) {
    const stream = frame.session_id === null || frame.session_id === undefined ? "registry" : frame.session_id;
    const detail = { stream, after_seq: frame.after_seq, epoch: frame.epoch, first_seq: frame.first_seq, last_seq: frame.last_seq };
    super("reset", frame.message || "position lost", detail);
    this.name = "PositionLost";
    this.frame = frame;
    this.epoch = frame.epoch;
    this.firstSeq = frame.first_seq;
    this.lastSeq = frame.last_seq;
  }
}
