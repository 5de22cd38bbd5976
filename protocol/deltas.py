"""How a streamed message grows by one delta: the same rule for the hub that applies a
writer's deltas, for a node mirroring another node's stream, and for a client rebuilding
the message from ``stream`` frames."""

from __future__ import annotations

from typing import Any

import msgspec

from .errors import InvalidInput

__all__ = ["GrowingParts", "apply_delta"]

_encode = msgspec.json.Encoder().encode


class GrowingParts:
    """A message's parts as deltas grow them, each delta in amortized O(1) of the text
    held: the last part's new text is kept as a list of chunks, joined when the parts are
    read (:meth:`parts`), not copied whole on every delta (``+=`` on a string held in a dict
    copies it, which made streaming one big message quadratic). Tool parts are found by
    ``toolCallId`` through an index, not a scan. :attr:`bytes` is the size (UTF-8 text,
    encoded tool parts) of what the deltas brought, for a limit."""

    __slots__ = ("_by_call", "_chunks", "_parts", "_tools", "awaiting", "bytes")

    def __init__(self, parts: list[dict[str, Any]] | None = None) -> None:
        self._parts: list[dict[str, Any]] = parts if parts is not None else []
        self._chunks: list[str] = []  # text of the last part not joined into it yet
        self._by_call: dict[Any, int] = {}
        self._tools: dict[int, int] = {}  # part position -> its encoded size
        self.bytes = 0
        #: The last delta applied was ``await``: the writer waits for the user.
        self.awaiting = False
        for i, existing in enumerate(self._parts):
            if existing.get("toolCallId") is not None:
                self._by_call.setdefault(existing["toolCallId"], i)

    def size_after(self, kind: Any, text: Any, part: Any) -> int:
        """:attr:`bytes` once this delta is applied (a malformed delta: as now; a ``reset``
        is counted as nothing, so a stream cannot regain its budget by resetting)."""
        if kind in ("text", "reasoning"):
            return self.bytes + _utf8(text) if isinstance(text, str) else self.bytes
        if not isinstance(part, dict) or kind in ("reset", "await"):
            return self.bytes
        if kind == "part":
            return self.bytes + _tool_size(part)
        replaced = self._by_call.get(part.get("toolCallId")) if part.get("toolCallId") is not None else None
        old = 0 if replaced is None else self._tools.get(replaced, 0)
        return self.bytes - old + _tool_size(part)

    def apply(self, kind: Any, text: Any, part: Any) -> None:
        """Grow the parts by one delta: text and reasoning extend the last part of their
        kind; a tool part replaces the part with its ``toolCallId`` (or is added). A delta
        that is none of these raises :class:`~protocol.errors.InvalidInput` and changes
        nothing.

        Three more kinds carry what the AI SDK 7 stream has beyond text and tools: ``part``
        appends any other part (``step-start``, ``file``, ``source-*``, ``custom``,
        ``reasoning-file``, ``steering-message``; a ``data-*`` part with an ``id`` replaces
        the one of that type and id, as the SDK reconciles them); ``reset`` drops the parts
        of the current step (those after the last ``step-start``: the SDK's ``reset-step``);
        ``await`` changes nothing: the writer waits for the user (a tool approval or a
        client tool's output), so a chat request ends there while the turn goes on."""
        parts = self._parts
        if kind == "await":
            self.awaiting = True
            return
        self.awaiting = False
        if kind == "reset":
            self._join()
            start = len(parts) - 1
            while start >= 0 and parts[start].get("type") != "step-start":
                start -= 1
            del parts[start + 1 :]
            self._by_call = {c: i for c, i in self._by_call.items() if i <= start}
            self._tools = {i: n for i, n in self._tools.items() if i <= start}
            return
        if kind == "part":
            self._other(part)
            return
        if kind in ("text", "reasoning"):
            if not isinstance(text, str):
                raise InvalidInput(f"a {kind} delta needs `text`")
            if parts and parts[-1].get("type") == kind and isinstance(parts[-1].get("text"), str):
                self._chunks.append(text)
            else:
                self._join()
                parts.append({"type": kind, "text": text})
            self.bytes += _utf8(text)
            return
        tool = part.get("type") if isinstance(part, dict) else None
        if (
            not isinstance(part, dict)
            or not isinstance(tool, str)
            or not (tool.startswith("tool-") or tool == "dynamic-tool")
        ):
            raise InvalidInput("a tool delta needs a `part` of type `tool-<name>` or `dynamic-tool`")
        self._join()
        size = _tool_size(part)
        call_id = part.get("toolCallId")
        at = self._by_call.get(call_id) if call_id is not None else None
        if at is None:
            at = len(parts)
            parts.append(dict(part))
            if call_id is not None:
                self._by_call[call_id] = at
        else:
            parts[at] = dict(part)
        self.bytes += size - self._tools.get(at, 0)
        self._tools[at] = size

    def _other(self, part: Any) -> None:
        kind = part.get("type") if isinstance(part, dict) else None
        if (
            not isinstance(part, dict)
            or not isinstance(kind, str)
            or kind in ("text", "reasoning", "dynamic-tool")
            or kind.startswith("tool-")
        ):
            raise InvalidInput(
                "a part delta needs a `part` whose type is not text, reasoning or a tool"
                " (those have their own kinds)"
            )
        self._join()
        parts = self._parts
        if kind.startswith("data-") and part.get("id") is not None:
            for i, existing in enumerate(parts):
                if existing.get("type") == kind and existing.get("id") == part["id"]:
                    parts[i] = dict(part)
                    self.bytes += _tool_size(part)
                    return
        parts.append(dict(part))
        self.bytes += _tool_size(part)

    def peek(self) -> list[dict[str, Any]]:
        """The parts without joining: the last part's ``text`` may lag behind the deltas
        (its type and the other parts are current)."""
        return self._parts

    def parts(self) -> list[dict[str, Any]]:
        """The parts as they stand (the list held, not a copy)."""
        self._join()
        return self._parts

    def _join(self) -> None:
        if self._chunks:
            last = self._parts[-1]
            last["text"] = "".join([last["text"], *self._chunks])
            self._chunks.clear()


def _utf8(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _tool_size(part: dict[str, Any]) -> int:
    try:
        return len(_encode(part))
    except (TypeError, ValueError, OverflowError):
        return 0


def apply_delta(parts: list[dict[str, Any]], kind: Any, text: Any, part: Any) -> None:
    """Grow ``parts`` in place by one delta (:meth:`GrowingParts.apply`), for a caller that
    holds the parts as a plain list: O(the part's text) per delta, so a hub holding a
    stream keeps a :class:`GrowingParts` instead."""
    grown = GrowingParts(parts)
    grown.apply(kind, text, part)
    grown.parts()  # joins the text it kept aside into the caller's list
