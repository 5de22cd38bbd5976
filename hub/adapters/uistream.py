"""The AI SDK's *UI message stream*: a streamed message, as the hub holds it, rendered as
the SDK's chunks.

A reply grows as stream frames (whole messages and deltas, :mod:`protocol.frames`);
``useChat()`` rebuilds it from chunks (``start``, ``text-start``/``-delta``/``-end``,
``reasoning-*``, ``tool-input-*`` and ``tool-output-*``, ``start-step``/``finish-step``,
``finish``, ``abort`` or ``error``). :class:`UIMessageEncoder` diffs the message as the hub
holds it against what a reader was sent, so what the SDK rebuilds is what the hub stores.
No I/O here: the SSE door (:mod:`.aisdk_chat`) and the AI SDK 7 WebSocket transport to come
frame the same chunks their own way (``web/chat-transport.js`` renders them in the browser
the same way too).
"""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Any

from protocol import InvalidInput
from protocol import frames as f
from protocol.deltas import GrowingParts

from ..server.turnframes import TurnOutcome

__all__ = ["Chunk", "UIMessageEncoder", "render", "sse_text"]

#: One chunk of the UI message stream, as JSON.
Chunk = dict[str, Any]

#: How far a tool part has come, by its state: input, approval asked, approval answered, output.
_TOOL_STAGE = {
    "input-streaming": 0,
    "input-available": 1,
    "approval-requested": 2,
    "approval-responded": 3,
    "output-available": 4,
    "output-error": 4,
    "output-denied": 4,
}
_OUTPUT = 4

#: Parts only AI SDK 7 readers get as chunks (an AI SDK 6 reader's schema refuses them).
_V7_PARTS = ("custom", "reasoning-file", "steering-message")


def _is_tool(part: dict[str, Any]) -> bool:
    kind = part.get("type")
    return isinstance(kind, str) and (kind.startswith("tool-") or kind == "dynamic-tool")


class UIMessageEncoder:
    """Turns one streamed message, as the hub holds it, into UI message stream chunks.

    Feed it snapshots (:meth:`message`) or deltas (:meth:`deltas`); each returns the chunks
    that take a reader from what it was sent to what the message is now. Text and reasoning
    grow by their new suffix; a tool part goes through input start, input available and
    output; step-start parts become ``start-step`` (and ``finish-step`` before the next)."""

    def __init__(self, message_id: str, v7: bool = False) -> None:
        self.message_id = message_id
        #: Render AI SDK 7's chunks too (``reset-step``, ``custom``, ``reasoning-file``,
        #: ``steering-message``, ``tool-approval-response``); an AI SDK 6 reader gets the
        #: chunks its schema knows, and the stored message has the rest.
        self.v7 = v7
        self._grown = GrowingParts()
        self.index = -1
        self._sent: list[dict[str, Any]] = []  # per part: what the reader has
        self._step = False
        self._metadata_sent = False
        self.metadata: Any = None

    def snapshot(self) -> dict[str, Any]:
        """The message as rendered so far (its parts are this encoder's: do not change them)."""
        return {"parts": self._grown.parts(), "metadata": self.metadata}

    def start(self) -> list[Chunk]:
        return [{"type": "start", "messageId": self.message_id}]

    @property
    def awaiting(self) -> bool:
        """The last delta was ``await``: the reply waits for the user."""
        return self._grown.awaiting

    def prime(self, message: dict[str, Any], index: int, awaiting: bool = False) -> None:
        """Take ``message`` as what the reader has already (a chat continuing the reply
        after the user answered a tool: its page holds the message up to here), so that
        only what comes after it is rendered. Its parts count as sent and closed."""
        self.message(message, index)
        for sent in self._sent:
            sent["open"] = False
            if sent.get("kind") == "tool":
                sent["stage"] = _OUTPUT
        for i, part in enumerate(self._grown.parts()):
            if _is_tool(part) and i < len(self._sent):
                self._sent[i]["stage"] = _TOOL_STAGE.get(str(part.get("state")), 0)
        self._grown.awaiting = awaiting

    def message(self, message: dict[str, Any], index: int) -> list[Chunk]:
        """A whole message (``start``, ``state``, ``end``): the reader catches up to it."""
        if index < self.index:
            return []
        self.index = index
        self._grown = GrowingParts(copy.deepcopy(list(message.get("parts") or [])))
        chunks: list[Chunk] = []
        metadata = message.get("metadata")
        if metadata is not None:
            self.metadata = metadata
        if metadata is not None and not self._metadata_sent:
            self._metadata_sent = True
            chunks.append({"type": "message-metadata", "messageMetadata": metadata})
        return chunks + self._diff()

    def deltas(self, deltas: list[dict[str, Any]]) -> list[Chunk]:
        """Deltas applied in index order, once each; a gap waits for the next whole message."""
        chunks: list[Chunk] = []
        for delta in deltas:
            if int(delta.get("index", -1)) != self.index + 1:
                continue
            if self._grown.awaiting:
                break  # this reader's request ended at the await; the rest is the next one's
            self.index += 1
            kind, text = delta.get("kind"), delta.get("text")
            if kind == "reset":
                chunks += self._reset()
                continue
            if kind == "await":
                self._grown.apply(kind, text, None)
                continue
            extends = self._extends_sent(kind, text)
            with contextlib.suppress(InvalidInput):  # the hub checked it; a bad one is skipped
                self._grown.apply(kind, text, delta.get("part"))
            if extends is not None:
                # The text grows the part the reader already has: its delta is the chunk, so
                # the part is not joined and sliced per delta (quadratic in a long reply).
                assert isinstance(text, str)
                extends["chars"] += len(text)
                chunks.append({"type": f"{kind}-delta", "id": extends["id"], "delta": text})
            else:
                chunks += self._diff()
        return chunks

    def _reset(self) -> list[Chunk]:
        """The SDK's ``reset-step``: the current step's parts go, here and in the reader."""
        chunks = self._close_open(len(self._sent))
        self._grown.apply("reset", None, None)
        del self._sent[len(self._grown.peek()) :]
        if self.v7:
            chunks.append({"type": "reset-step"})
        return chunks

    def _extends_sent(self, kind: Any, text: Any) -> dict[str, Any] | None:
        """What the reader has of the last part, when a ``kind`` delta of ``text`` only
        grows it; None when the delta needs the whole diff (a new part, a tool)."""
        if kind not in ("text", "reasoning") or not isinstance(text, str) or not text:
            return None
        parts = self._grown.peek()
        if not parts or len(self._sent) != len(parts) or parts[-1].get("type") != kind:
            return None
        if not isinstance(parts[-1].get("text"), str):  # GrowingParts starts a new part
            return None
        sent = self._sent[-1]
        return sent if sent.get("kind") == kind else None

    def close(self) -> list[Chunk]:
        """The message is complete: end open parts and the open step."""
        chunks = self._close_open(len(self._sent))
        if self._step:
            self._step = False
            chunks.append({"type": "finish-step"})
        return chunks

    def _close_open(self, before: int) -> list[Chunk]:
        chunks: list[Chunk] = []
        for sent in self._sent[:before]:
            if sent.get("open"):
                sent["open"] = False
                chunks.append({"type": f"{sent['kind']}-end", "id": sent["id"]})
        return chunks

    def _diff(self) -> list[Chunk]:
        chunks: list[Chunk] = []
        for i, part in enumerate(self._grown.parts()):
            if i >= len(self._sent):
                chunks += self._close_open(i)  # only the last part can still grow
                self._sent.append({})
                chunks += self._first(i, part)
            chunks += self._grow(i, part)
        return chunks

    def _first(self, i: int, part: dict[str, Any]) -> list[Chunk]:
        kind = part.get("type")
        sent = self._sent[i]
        if kind in ("text", "reasoning"):
            sent.update(kind=kind, id=f"{kind}-{i}", chars=0, open=True)
            chunk: Chunk = {"type": f"{kind}-start", "id": sent["id"]}
            if part.get("providerMetadata") is not None:
                chunk["providerMetadata"] = part["providerMetadata"]
            return [chunk]
        if _is_tool(part):
            sent.update(kind="tool", stage=-1)
            return []
        sent.update(kind="other")
        if kind == "step-start":
            chunks: list[Chunk] = [{"type": "finish-step"}] if self._step else []
            self._step = True
            return [*chunks, {"type": "start-step"}]
        if kind == "file":
            return [{"type": "file", "url": part.get("url", ""), "mediaType": part.get("mediaType", "")}]
        if isinstance(kind, str) and kind.startswith("data-"):
            sent.update(kind="data", json=copy.deepcopy(part))
            return [dict(part)]
        if kind in ("source-url", "source-document"):
            return [dict(part)]
        if kind in _V7_PARTS and self.v7:
            return [_v7_chunk(part)]
        return []  # a part the reader's stream protocol cannot carry: it is in the stored message

    def _grow(self, i: int, part: dict[str, Any]) -> list[Chunk]:
        sent = self._sent[i]
        if sent.get("kind") in ("text", "reasoning"):
            text = part.get("text")
            if not isinstance(text, str) or len(text) <= sent["chars"]:
                return []
            delta, sent["chars"] = text[sent["chars"] :], len(text)
            return [{"type": f"{sent['kind']}-delta", "id": sent["id"], "delta": delta}]
        if sent.get("kind") == "data" and part != sent.get("json"):
            # A data part replaced by its id: the SDK reconciles the chunk with the same id.
            sent["json"] = copy.deepcopy(part)
            return [dict(part)]
        if sent.get("kind") != "tool":
            return []
        return self._tool(sent, part)

    def _tool(self, sent: dict[str, Any], part: dict[str, Any]) -> list[Chunk]:
        kind = str(part.get("type"))
        dynamic = kind == "dynamic-tool"
        name = str(part.get("toolName", "")) if dynamic else kind[len("tool-") :]
        call = str(part.get("toolCallId", ""))
        common: Chunk = {"toolCallId": call, "toolName": name}
        if dynamic:
            common["dynamic"] = True
        for key in ("providerExecuted", "title"):
            if part.get(key) is not None:
                common[key] = part[key]
        stage = _TOOL_STAGE.get(str(part.get("state")), 0)
        chunks: list[Chunk] = []
        if sent["stage"] < 0:
            chunks.append({"type": "tool-input-start", **common})
            sent["stage"] = 0
        if stage >= 1 and sent["stage"] < 1:
            chunks.append({"type": "tool-input-available", **common, "input": part.get("input")})
            sent["stage"] = 1
        found = part.get("approval")
        approval: dict[str, Any] = found if isinstance(found, dict) else {}
        if stage >= 2 and sent["stage"] < 2 and approval.get("id") is not None:
            chunks.append(
                {"type": "tool-approval-request", "approvalId": str(approval["id"]), "toolCallId": call}
            )
        if stage >= 3 and sent["stage"] < 3 and self.v7 and "approved" in approval:
            response: Chunk = {
                "type": "tool-approval-response",
                "approvalId": str(approval.get("id", "")),
                "approved": bool(approval.get("approved")),
            }
            if approval.get("reason") is not None:
                response["reason"] = str(approval["reason"])
            chunks.append(response)
        sent["stage"] = max(sent["stage"], min(stage, 3))
        if stage >= _OUTPUT and sent["stage"] < _OUTPUT:
            if part.get("state") == "output-denied":
                chunks.append({"type": "tool-output-denied", "toolCallId": call})
            elif part.get("state") == "output-error":
                chunks.append(
                    {
                        "type": "tool-output-error",
                        "toolCallId": call,
                        "errorText": str(part.get("errorText", "")),
                    }
                )
            else:
                chunks.append(
                    {"type": "tool-output-available", "toolCallId": call, "output": part.get("output")}
                )
            sent["stage"] = _OUTPUT
        return chunks


def _v7_chunk(part: dict[str, Any]) -> Chunk:
    """An AI SDK 7 part as its chunk (the chunk's fields are the part's)."""
    kind = part.get("type")
    if kind == "steering-message":
        return {
            "type": "steering-message",
            "id": str(part.get("id", "")),
            "parts": list(part.get("parts") or []),
        }
    if kind == "custom":
        return {k: v for k, v in part.items() if k in ("type", "kind", "providerMetadata")}
    return dict(part)  # reasoning-file: {type, mediaType, url/data, providerMetadata}


def sse_text(chunks: list[Chunk]) -> str:
    """The chunks as SSE ``data:`` events (ASCII)."""
    # json.dumps escapes non-ASCII: the feed sends the text as ASCII bytes.
    return "".join(f"data: {json.dumps(c, separators=(',', ':'))}\n\n" for c in chunks)


def render(encoder: UIMessageEncoder, item: f.StreamFrame | TurnOutcome) -> tuple[list[Chunk], bool]:
    """The chunks one stream frame (or the turn's outcome, ``True``: the last) makes, as
    :class:`UIMessageEncoder` ``encoder`` renders the reply."""
    if isinstance(item, TurnOutcome):
        chunks = encoder.close()
        if item.status == "finished":
            chunks.append({"type": "finish", "finishReason": "stop"})
        elif item.status == "stopped":
            # What the SDK's own streamText sends when its generation is aborted.
            chunks.append({"type": "abort", "reason": item.reason or "stopped"})
        else:
            chunks.append({"type": "error", "errorText": item.error or "the turn failed"})
        return chunks, True
    if item.action == "delta":
        chunks = encoder.deltas(item.deltas or [])
        if encoder.awaiting:
            # The writer waits for the user (a tool approval, a client tool's result): this
            # request ends as the SDK's own does at such a step; the turn goes on, and the
            # chat's next request (the answer) continues the same message.
            return [*chunks, *encoder.close(), {"type": "finish", "finishReason": "tool-calls"}], True
        return chunks, False
    if item.message is not None:
        return encoder.message(item.message, item.index), False
    return [], False
