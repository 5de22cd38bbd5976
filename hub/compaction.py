"""Compaction: summarize the middle of a long history into an overlay (spec §11).

``create_compact_function(summarize, ...)`` is the original's reference algorithm: a
protected head, a token-budgeted tail that always keeps the newest message, boundaries
moved so a tool call and its result are never split, and the structured summary prompt,
updated iteratively from the previous summary. Nothing is deleted: the session lays the
summary over the span as an overlay.

Departures: a structured tool output appears in the prompt as compact JSON (the original
printed ``[object Object]``); a blank summary is a failed compaction, never an overlay.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import msgspec

from protocol import InvalidInput, Message, coerce_message

from .context import call
from .store.overlays import COMPACTION_PREFIX
from .tokens import estimate_message_tokens, js_json, utf16_len

__all__ = [
    "CompactContext",
    "CompactFunction",
    "CompactResult",
    "Summarizer",
    "align_boundary_backward",
    "align_boundary_forward",
    "build_summary_prompt",
    "compute_summary_budget",
    "create_compact_function",
    "find_tail_cut_by_tokens",
    "is_compaction_message",
    "sanitize_tool_pairs",
    "summarizing_session",
    "truncate_older_messages",
    "truncate_tool_output",
]

_STRUCTURE = """## Topic
[What the conversation is about]

## Key Points
[Important information, decisions, and conclusions from the conversation]

## Current State
[Where things stand now — what has been done, what is in progress]

## Open Items
[Unresolved questions, pending tasks, or next steps discussed]"""

_TARGET = (
    "Target ~{budget} tokens. Be factual — only include information that was explicitly discussed "
    "in the conversation. Do NOT invent file paths, commands, or details that were not mentioned. "
    "Write only the summary body."
)

STUB_RESULT = "[Result from earlier conversation — see context summary above]"

_NO_ID = object()


@dataclass(frozen=True)
class CompactResult:
    """What a compaction function proposes: lay ``summary`` over ``from``..``to``."""

    from_message_id: str
    to_message_id: str
    summary: str

    @classmethod
    def coerce(cls, value: Any) -> CompactResult | None:
        """Accept a CompactResult or a dict with snake_case or camelCase keys."""
        if value is None or isinstance(value, CompactResult):
            return value
        if isinstance(value, Mapping):
            start = value.get("from_message_id", value.get("fromMessageId"))
            end = value.get("to_message_id", value.get("toMessageId"))
            summary = value.get("summary")
            if isinstance(start, str) and isinstance(end, str) and isinstance(summary, str):
                return cls(start, end, summary)
        raise TypeError(f"a compaction function must return a CompactResult or None, got {value!r}")


@dataclass(frozen=True)
class CompactContext:
    """Passed to a compaction function: the session's token counter, when configured, and
    the id of the session being compacted."""

    token_counter: Callable[[dict[str, Any]], Any] | None = None
    session_id: str | None = None


#: The session a summary prompt is about, while :func:`create_compact_function`'s
#: compaction waits for its summarizer (from ``CompactContext.session_id``). A summarizer
#: that serves several sessions reads it to know whose history it holds: the hub's
#: :class:`~hub.server.workers.WorkerSummarizer` sends a prompt only to workers allowed on it.
summarizing_session: ContextVar[str | None] = ContextVar("summarizing_session", default=None)


CompactFunction = Callable[[list[Message], CompactContext], Any]


class Summarizer(Protocol):
    """Anything that turns a summary prompt into a summary (sync or async)."""

    def __call__(self, prompt: str) -> str | Awaitable[str]: ...


# -- tool-part helpers ---------------------------------------------------------------------


def _is_tool_part(part: Mapping[str, Any]) -> bool:
    kind = part.get("type")
    return isinstance(kind, str) and (kind.startswith("tool-") or kind == "dynamic-tool")


def _tool_parts(message: Message) -> list[dict[str, Any]]:
    return [p for p in message.parts if _is_tool_part(p)]


def _part_call_id(part: Mapping[str, Any]) -> Any:
    """A tool part's call id: ``toolCallId``, or inside ``toolInvocation`` for the AI SDK
    v4 ``tool-invocation`` parts (departure: the original did not see those, so it could
    separate such a call from its result)."""
    if "toolCallId" in part:
        return part["toolCallId"]
    legacy = part.get("toolInvocation")
    if isinstance(legacy, Mapping) and "toolCallId" in legacy:
        return legacy["toolCallId"]
    return _NO_ID


def _call_ids(message: Message) -> set[Any]:
    ids = set()
    for p in _tool_parts(message):
        call_id = _part_call_id(p)
        if call_id is not _NO_ID:
            try:
                ids.add(call_id)
            except TypeError:  # an unhashable id cannot pair with anything
                continue
    return ids


def _answers(message: Message, call_ids: set[Any]) -> bool:
    """Whether the message holds a tool part for one of ``call_ids`` (its result)."""
    for p in _tool_parts(message):
        call_id = _part_call_id(p)
        try:
            if call_id is not _NO_ID and call_id in call_ids:
                return True
        except TypeError:
            continue
    return False


def _js_truthy(value: Any) -> bool:
    # JavaScript truthiness: empty objects and arrays are true, 0 / "" / null / NaN false.
    if value is None or value is False or value == "":
        return False
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value != 0 and not math.isnan(value)
    return True


def _is_assistant_with_tools(message: Message) -> bool:
    return message.role == "assistant" and bool(_tool_parts(message))


def is_compaction_message(message: Message | Mapping[str, Any]) -> bool:
    mid = message.id if isinstance(message, Message) else message.get("id")
    return isinstance(mid, str) and mid.startswith(COMPACTION_PREFIX)


def align_boundary_forward(messages: Sequence[Message], index: int) -> int:
    """Move a head boundary forward past results of the tool calls just before it."""
    n = len(messages)
    if index <= 0 or index >= n:
        return index
    previous = messages[index - 1]
    if not _is_assistant_with_tools(previous):
        return index
    ids = _call_ids(previous)
    while index < n and _answers(messages[index], ids):
        index += 1
    return index


def align_boundary_backward(messages: Sequence[Message], index: int) -> int:
    """Move a tail boundary back so a result never starts the tail without its call."""
    n = len(messages)
    if index <= 0 or index >= n:
        return index
    while index > 0:
        current = messages[index]
        previous = messages[index - 1]
        # Departure: a result is pulled back to its call even when the result message is
        # an assistant's own (multi-step tool use); the original stopped at any assistant
        # message with tool parts and could start the tail with an orphaned result.
        if _is_assistant_with_tools(previous) and _answers(current, _call_ids(previous)):
            index -= 1
            continue
        break
    return index


async def find_tail_cut_by_tokens(
    messages: Sequence[Message],
    head_end: int,
    budget: int = 20_000,
    min_tail: int = 2,
    tokens: Callable[[Message], Any] | None = None,
) -> int:
    """Where the kept tail starts: as many newest messages as fit ``budget`` (the newest
    always), at least ``min_tail`` of them, aligned so no tool result loses its call."""
    count = tokens or (lambda m: estimate_message_tokens([m]))
    n = len(messages)
    acc = 0.0
    cut = n
    for i in range(n - 1, head_end - 1, -1):
        t = _finite(await call(count, messages[i]))
        if acc + t > budget and cut < n:
            break
        acc += t
        cut = i
    min_cut = n - min_tail
    index = min(cut, min_cut) if min_cut >= head_end else cut
    return align_boundary_backward(messages, index)


def _finite(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) else 0.0


def compute_summary_budget(messages: Sequence[Message]) -> int:
    """About a fifth of what is being summarized, at least 100 tokens."""
    return max(100, math.floor(0.2 * estimate_message_tokens(messages)))


def _clip(text: str, units: int = 500) -> str:
    # JavaScript's slice(0, 500): UTF-16 code units.
    if utf16_len(text) <= units:
        return text
    return text.encode("utf-16-le", "surrogatepass")[: units * 2].decode("utf-16-le", "ignore")


def _serialize(message: Message) -> str:
    text = "\n".join(
        p["text"] for p in message.parts if p.get("type") == "text" and isinstance(p.get("text"), str)
    )
    out = f"[{message.role}]\n{text}"
    blocks = []
    for part in _tool_parts(message):
        legacy = part.get("toolInvocation")
        if "toolName" not in part and isinstance(legacy, Mapping):
            # AI SDK v4 parts keep the call inside toolInvocation (args / result).
            part = {
                "toolName": legacy.get("toolName"),
                "input": legacy.get("args"),
                "output": legacy.get("result"),
            }
        name = part.get("toolName")
        lines = [f"[Tool: {'unknown' if name is None else name}]"]
        if _js_truthy(part.get("input")):
            lines.append(f"Input: {_clip(js_json(part['input']))}")
        output = part.get("output")
        if _js_truthy(output):
            # Departure: structured outputs as JSON, not "[object Object]".
            rendered = output if isinstance(output, str) else js_json(output)
            lines.append(f"Output: {_clip(rendered)}")
        blocks.append("\n".join(lines))
    if blocks:
        out += "\n" + "\n".join(blocks)
    return out


def build_summary_prompt(messages: Sequence[Message], previous_summary: str | None, budget: int) -> str:
    """The original's structured summary prompt, first or iterative."""
    content = "\n\n---\n\n".join(_serialize(m) for m in messages)
    target = _TARGET.format(budget=budget)
    if previous_summary:
        return (
            "You are updating a conversation summary. A previous summary exists below. New "
            "conversation turns have occurred since then and need to be incorporated.\n\n"
            f"PREVIOUS SUMMARY:\n{previous_summary}\n\nNEW TURNS TO INCORPORATE:\n{content}\n\n"
            "Update the summary. PRESERVE existing information that is still relevant. ADD new "
            "information. Remove information only if it is clearly obsolete.\n\n"
            f"{_STRUCTURE}\n\n{target}"
        )
    return (
        "Create a concise summary of this conversation that preserves the important information "
        f"for future context.\n\nCONVERSATION TO SUMMARIZE:\n{content}\n\nUse this structure:\n\n"
        f"{_STRUCTURE}\n\n{target}"
    )


def create_compact_function(
    summarize: Summarizer,
    *,
    protect_head: int = 3,
    tail_token_budget: int = 20_000,
    min_tail_messages: int = 2,
    token_counter: Callable[[list[Message]], Any] | None = None,
) -> CompactFunction:
    """The reference compaction function. ``summarize(prompt)`` may be sync or async.
    ``token_counter(messages)`` sizes the tail; without it the session's counter (from
    ``compact_after``) is used, else the heuristic estimate."""

    async def compact(
        given: Sequence[Message | Mapping[str, Any]], context: CompactContext | None = None
    ) -> CompactResult | None:
        # UIMessage dicts are accepted as everywhere else (a port calls it with what it has).
        if isinstance(given, Mapping | str) or not isinstance(given, Sequence):
            raise InvalidInput("messages must be a list of messages")
        messages = [coerce_message(m) for m in given]
        if len(messages) <= protect_head + min_tail_messages:
            return None
        counter: Callable[[Message], Any]
        if token_counter is not None:
            explicit = token_counter

            async def counter(m: Message) -> Any:
                return await call(explicit, [m])

        elif context is not None and context.token_counter is not None:
            session_counter = context.token_counter

            async def counter(m: Message) -> Any:
                return await call(
                    session_counter, {"messages": [m], "system_prompt": "", "context_blocks": []}
                )

        else:

            def counter(m: Message) -> Any:
                return estimate_message_tokens([m])

        start = align_boundary_forward(messages, protect_head)
        end = await find_tail_cut_by_tokens(messages, start, tail_token_budget, min_tail_messages, counter)
        if end <= start:
            return None
        middle = [m for m in messages[start:end] if not is_compaction_message(m)]
        if not middle:
            return None
        previous = next((m for m in messages if is_compaction_message(m)), None)
        previous_summary = None
        if previous is not None:
            previous_summary = "\n".join(
                p["text"]
                for p in previous.parts
                if p.get("type") == "text" and isinstance(p.get("text"), str)
            )
        prompt = build_summary_prompt(middle, previous_summary, compute_summary_budget(middle))
        session_id = None if context is None else context.session_id
        if session_id is None:
            summary = await call(summarize, prompt)
        else:
            about = summarizing_session.set(session_id)
            try:
                summary = await call(summarize, prompt)
            finally:
                summarizing_session.reset(about)
        if not isinstance(summary, str) or not summary.strip():
            return None
        return CompactResult(middle[0].id, middle[-1].id, summary)

    return compact


# -- utilities -----------------------------------------------------------------------------


def _call_id_list(message: Message) -> list[Any]:
    # An insertion-ordered set, like the original's Set.
    return list(dict.fromkeys(p["toolCallId"] for p in _tool_parts(message) if "toolCallId" in p))


def sanitize_tool_pairs(messages: Sequence[Message]) -> list[Message]:
    """Make a message list safe for providers that reject unpaired tool calls (the
    original's ``sanitizeToolPairs``): results without a surviving call are removed, calls
    without a result get a stub result right after them, emptied messages are dropped."""
    surviving: dict[Any, None] = {}
    for m in messages:
        if m.role == "assistant":
            surviving.update(dict.fromkeys(_call_id_list(m)))
    results = {
        p["toolCallId"] for m in messages for p in _tool_parts(m) if "toolCallId" in p and "output" in p
    }
    orphaned = {i for i in results if i not in surviving}
    out: list[Message] = list(messages)
    if orphaned:
        filtered = []
        for m in out:
            parts = [
                p
                for p in m.parts
                if not (
                    _is_tool_part(p) and "toolCallId" in p and "output" in p and p["toolCallId"] in orphaned
                )
            ]
            filtered.append(m if len(parts) == len(m.parts) else _with_parts(m, parts))
        out = filtered
    missing = {i for i in surviving if i not in results and i not in orphaned}
    if missing:
        patched: list[Message] = []
        for m in out:
            patched.append(m)
            if m.role != "assistant":
                continue
            for call_id in _call_id_list(m):
                if call_id not in missing:
                    continue
                call_part = next((p for p in m.parts if p.get("toolCallId", _NO_ID) == call_id), None)
                name = None if call_part is None else call_part.get("toolName")
                patched.append(
                    Message(
                        id=f"stub-{call_id}",
                        role="assistant",
                        parts=[
                            {
                                "type": "tool-result",
                                "toolCallId": call_id,
                                "toolName": "unknown" if name is None else name,
                                "result": STUB_RESULT,
                            }
                        ],
                        created_at=datetime.now(UTC),
                    )
                )
        out = patched
    return [m for m in out if m.parts]


def _with_parts(message: Message, parts: list[dict[str, Any]]) -> Message:
    return msgspec.structs.replace(message, parts=parts)


_TRUNCATED_FLAG = "__truncated"
_TRUNCATED_CHARS = "__truncatedChars"
_MAX_DEPTH = 8


def _length(value: Any) -> int:
    return utf16_len(value if isinstance(value, str) else js_json(value))


def _suffix(original_length: int) -> str:
    return f"... [truncated {original_length} chars]"


def _truncate_string(value: str, max_chars: int, original_length: int) -> str:
    if utf16_len(value) <= max_chars:
        return value
    suffix = _suffix(original_length)
    if max_chars <= len(suffix):
        return suffix[:max_chars]
    return _clip(value, max_chars - len(suffix)) + suffix


def _child_budget(max_chars: int, count: int) -> int:
    if count <= 1:
        return max_chars
    return max(80, max_chars // min(count, 10))


def _object_marker(max_chars: int, original_length: int) -> dict[str, Any]:
    marker: dict[str, Any] = {
        _TRUNCATED_FLAG: True,
        _TRUNCATED_CHARS: original_length,
        "note": "Tool output omitted because it was too large to preserve structurally.",
    }
    if _length(marker) <= max_chars:
        return marker
    return {_TRUNCATED_FLAG: True, _TRUNCATED_CHARS: original_length}


def _array_marker(max_chars: int, original_length: int) -> list[Any]:
    structured = _object_marker(max_chars, original_length)
    if _length([structured]) <= max_chars:
        return [structured]
    marker = [
        "Array output omitted because it was too large to preserve structurally " + _suffix(original_length)
    ]
    if _length(marker) <= max_chars:
        return marker
    return [_suffix(original_length)[:max_chars]]


def _truncate_value(value: Any, max_chars: int, original_length: int, depth: int) -> Any:
    if isinstance(value, str):
        return _truncate_string(value, max_chars, utf16_len(value))
    if isinstance(value, list):
        if depth >= _MAX_DEPTH:
            return f"[Nested output omitted {_suffix(original_length)}]"
        budget = _child_budget(max_chars, len(value))
        items = [_truncate_value(v, budget, _length(v), depth + 1) for v in value]
        while len(items) > 1 and _length(items) > max_chars:
            items.pop()
        if len(items) < len(value):
            items.append(f"Array output truncated {_suffix(original_length)}")
        if _length(items) > max_chars:
            return _array_marker(max_chars, original_length)
        return items
    if isinstance(value, Mapping):
        if depth >= _MAX_DEPTH:
            return f"[Nested output omitted {_suffix(original_length)}]"
        budget = _child_budget(max_chars, len(value))
        result: dict[str, Any] = {
            str(k): _truncate_value(v, budget, _length(v), depth + 1) for k, v in value.items()
        }
        result_length = _length(result)
        if result_length <= max_chars:
            return result
        strings = sorted(
            ((k, v) for k, v in result.items() if isinstance(v, str)),
            key=lambda kv: -utf16_len(kv[1]),
        )
        for key, text in strings:
            if _length(result) <= max_chars:
                break
            result[key] = _truncate_string(text, max(0, max_chars // 4), utf16_len(text))
        if _length(result) > max_chars:
            result[_TRUNCATED_FLAG] = True
            result[_TRUNCATED_CHARS] = result_length
        if _length(result) > max_chars:
            return _object_marker(max_chars, original_length)
        return result
    return value


def truncate_tool_output(value: Any, max_chars: int = 500) -> tuple[Any, bool]:
    """Shrink a tool output to ``max_chars`` (JSON length) keeping its shape, exactly as the
    original's ``truncateToolOutput``: strings get a ``... [truncated N chars]`` suffix,
    arrays and objects keep what fits plus ``__truncated`` / ``__truncatedChars`` markers.
    Returns ``(output, truncated)``; an output that fits is returned as it is."""
    original = _length(value)
    if original <= max_chars:
        return value, False
    return _truncate_value(value, max_chars, original, 0), True


def truncate_older_messages(
    messages: Sequence[Message],
    *,
    keep_recent: int = 4,
    max_tool_output_chars: int = 500,
    max_text_chars: int = 10_000,
) -> list[Message]:
    """A read-time view with old tool outputs and long texts shortened; the newest
    ``keep_recent`` messages, and every unchanged message, are returned as they are."""
    if len(messages) <= keep_recent:
        return list(messages)
    cutoff = len(messages) - keep_recent
    out: list[Message] = []
    for i, m in enumerate(messages):
        if i >= cutoff:
            out.append(m)
            continue
        changed = False
        parts = []
        for p in m.parts:
            if _is_tool_part(p) and p.get("output") is not None:
                output, truncated = truncate_tool_output(p["output"], max_tool_output_chars)
                if truncated:
                    p = {**p, "output": output}
                    changed = True
            elif p.get("type") == "text" and isinstance(p.get("text"), str):
                text = p["text"]
                length = utf16_len(text)
                if length > max_text_chars:
                    p = {**p, "text": f"{_clip(text, max_text_chars)}... [truncated {length} chars]"}
                    changed = True
            parts.append(p)
        out.append(_with_parts(m, parts) if changed else m)
    return out
