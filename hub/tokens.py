"""Token estimation, exactly as the original's heuristic (spec §3).

A conservative estimate, not a tokenizer: ``ceil(max(utf16_length / 4, words * 1.3))``
per string and 4 per message. Real tokenizers need their vocabularies (tiktoken downloads
them at run time, which this deployment cannot rely on); a session that wants exact counts
passes its own counter to ``compact_after(..., token_counter=...)``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from protocol.message import Message, format_js_iso

__all__ = [
    "CHARS_PER_TOKEN",
    "TOKENS_PER_MESSAGE",
    "WORDS_TOKEN_MULTIPLIER",
    "estimate_message_tokens",
    "estimate_string_tokens",
    "estimate_value_tokens",
    "js_json",
    "utf16_len",
]

CHARS_PER_TOKEN = 4
WORDS_TOKEN_MULTIPLIER = 1.3
TOKENS_PER_MESSAGE = 4

# JavaScript's \s (ECMAScript WhiteSpace + LineTerminator), which differs from Python's:
# it includes U+FEFF and excludes U+001C..U+001F and U+0085.
JS_WHITESPACE = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_JS_SPACE = re.compile(f"[{JS_WHITESPACE}]+")


def utf16_len(text: str) -> int:
    """JavaScript's ``string.length``: UTF-16 code units."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def estimate_string_tokens(text: str | None) -> int:
    if not text:
        return 0
    words = sum(1 for w in _JS_SPACE.split(text) if w)
    return math.ceil(max(utf16_len(text) / CHARS_PER_TOKEN, words * WORDS_TOKEN_MULTIPLIER))


def _js_number(value: float) -> str:
    """``Number.prototype.toString``: the shortest round-trip digits (as ``repr``), in plain
    notation for 1e-6 <= |x| < 1e21 and exponent notation outside."""
    if math.isnan(value) or math.isinf(value):
        return "null"
    if value == 0:
        return "0"
    text = repr(value)
    if 1e-6 <= abs(value) < 1e21:
        plain = format(Decimal(text), "f")
        if "." in plain:
            plain = plain.rstrip("0").rstrip(".")
        return plain
    mantissa, exponent = text.split("e")
    sign = "-" if exponent.startswith("-") else "+"
    return f"{mantissa}e{sign}{int(exponent.lstrip('+-'))}"


def _js_string(text: str) -> str:
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\b":
            out.append("\\b")
        elif ch == "\f":
            out.append("\\f")
        elif code < 0x20 or 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _is_array_index(key: str) -> bool:
    return key.isascii() and key.isdigit() and (key == "0" or key[0] != "0") and int(key) < 2**32 - 1


def js_json(value: Any) -> str:
    """``JSON.stringify(value)`` as JavaScript renders it: no spaces, non-ASCII kept,
    integral floats without ``.0``, NaN/Infinity as ``null``, datetimes as ISO strings."""
    if value is None or value is True or value is False:
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, str):
        return _js_string(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _js_number(value)
    if isinstance(value, datetime):
        return _js_string(format_js_iso(value))
    if isinstance(value, Message):
        return js_json(value.to_dict())
    if isinstance(value, Mapping):
        items = [(str(k), v) for k, v in value.items()]
        # JS objects list integer-like keys first, ascending, then the rest in insertion order.
        index_keys = sorted((k for k, _ in items if _is_array_index(k)), key=int)
        if index_keys:
            lookup = dict(items)
            items = [(k, lookup[k]) for k in index_keys] + [
                (k, v) for k, v in items if not _is_array_index(k)
            ]
        return "{" + ",".join(f"{_js_string(k)}:{js_json(v)}" for k, v in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join("null" if v is None else js_json(v) for v in value) + "]"
    return _js_string(str(value))


def estimate_value_tokens(value: Any) -> int:
    """A tool input, output or result: strings as text, anything else as compact JSON."""
    if value is None:
        return 0
    if isinstance(value, str):
        return estimate_string_tokens(value)
    return estimate_string_tokens(js_json(value))


def _part_tokens(part: Mapping[str, Any]) -> int:
    kind = part.get("type")
    if kind in ("text", "reasoning"):
        text = part.get("text")
        if text is None:
            text = part.get("reasoning")
        return estimate_value_tokens(text)
    if isinstance(kind, str) and (kind.startswith("tool-") or kind == "dynamic-tool"):
        output = part.get("output")
        if output is None:
            output = part.get("result")
        return estimate_value_tokens(part.get("input")) + estimate_value_tokens(output)
    if "text" in part:
        return estimate_value_tokens(part["text"])
    if "result" in part:
        return estimate_value_tokens(part["result"])
    return 0


def estimate_message_tokens(messages: Iterable[Message | Mapping[str, Any]]) -> int:
    total = 0
    for message in messages:
        parts = message.parts if isinstance(message, Message) else message.get("parts") or []
        total += TOKENS_PER_MESSAGE
        for part in parts:
            if isinstance(part, Mapping):
                total += _part_tokens(part)
    return total
