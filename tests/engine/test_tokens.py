"""Token estimation, JavaScript JSON and entry keys (spec §3, §7.6, §14).

Every reference below is written independently in this file from the spec's wording
(ECMAScript whitespace, UTF-16 code units, ``Number::toString``, FNV-1a over UTF-16), not
copied from the engine. The fixed vectors are the spec's and those the real original
recorded (``golden/exp-0.22.0/tokens.json``, ``tool_execution.json``).
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hub import Message, context_entry_key
from hub.tokens import (
    CHARS_PER_TOKEN,
    TOKENS_PER_MESSAGE,
    WORDS_TOKEN_MULTIPLIER,
    estimate_message_tokens,
    estimate_string_tokens,
    estimate_value_tokens,
    js_json,
    utf16_len,
)

# -- independent references ------------------------------------------------------------------

# ECMAScript WhiteSpace (TAB, VT, FF, SP, NBSP, ZWNBSP, every Zs) + LineTerminator (LF, CR,
# LS, PS): what both `\s` in a JS regex and `String.prototype.trim` remove.
JS_WHITESPACE = frozenset(
    {"\t", "\v", "\f", " ", "\u00a0", "\ufeff", "\n", "\r", "\u2028", "\u2029"}
    | {chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Zs"}
)
# Characters on which Python and JavaScript disagree about "whitespace".
PY_ONLY_WHITESPACE = ["\x1c", "\x1d", "\x1e", "\x1f", "\x85"]
DISPUTED = ["\ufeff", "\u180e", *PY_ONLY_WHITESPACE]


def ref_utf16_units(text: str) -> list[int]:
    units: list[int] = []
    for ch in text:
        code = ord(ch)
        if code > 0xFFFF:
            code -= 0x10000
            units += [0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)]
        else:
            units.append(code)
    return units


def ref_word_count(text: str) -> int:
    words, inside = 0, False
    for ch in text:
        if ch in JS_WHITESPACE:
            inside = False
        elif not inside:
            inside, words = True, words + 1
    return words


def ref_estimate(text: str | None) -> int:
    if not text:
        return 0
    return math.ceil(max(len(ref_utf16_units(text)) / 4, ref_word_count(text) * 1.3))


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def ref_value_tokens(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return ref_estimate(value)
    return ref_estimate(compact_json(value))


def ref_part_tokens(part: dict[str, Any]) -> int:
    kind = part["type"]
    if kind in ("text", "reasoning"):
        return ref_value_tokens(part["text"] if part.get("text") is not None else part.get("reasoning"))
    if kind.startswith("tool-") or kind == "dynamic-tool":
        output = part.get("output")
        return ref_value_tokens(part.get("input")) + ref_value_tokens(
            output if output is not None else part.get("result")
        )
    if "text" in part:
        return ref_value_tokens(part["text"])
    if "result" in part:
        return ref_value_tokens(part["result"])
    return 0


def ref_js_number(value: float) -> str:
    """``JSON.stringify(number)``: ECMAScript Number::toString(10) on the shortest
    round-trip digits (which Python's ``repr`` also yields); NaN and ±Infinity → null."""
    if math.isnan(value) or math.isinf(value):
        return "null"
    if value == 0:
        return "0"
    if value < 0:
        return "-" + ref_js_number(-value)
    sign, digit_tuple, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int) and sign == 0
    s = "".join(map(str, digit_tuple))
    k = len(s)
    n = k + exponent  # value = s × 10^(n − k)
    if k <= n <= 21:
        return s + "0" * (n - k)
    if 0 < n <= 21:
        return s[:n] + "." + s[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + s
    e = n - 1
    exp = ("+" if e >= 0 else "-") + str(abs(e))
    return (s if k == 1 else s[0] + "." + s[1:]) + "e" + exp


def is_array_index(key: str) -> bool:
    return re.fullmatch(r"0|[1-9][0-9]*", key) is not None and int(key) < 2**32 - 1


def ref_js_trim(text: str) -> str:
    start, end = 0, len(text)
    while start < end and text[start] in JS_WHITESPACE:
        start += 1
    while end > start and text[end - 1] in JS_WHITESPACE:
        end -= 1
    return text[start:end]


def ref_base36(value: int) -> str:
    alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        out = alphabet[value % 36] + out
        value //= 36
        if value == 0:
            return out


def ref_stable_hash(text: str) -> str:
    h = 0x811C9DC5
    for unit in ref_utf16_units(text):
        h = ((h ^ unit) * 0x01000193) % 2**32
    return ref_base36(h)


def ref_slugify(text: str) -> str:
    units = ref_utf16_units(text)[:60]
    prefix = b"".join(u.to_bytes(2, "little") for u in units).decode("utf-16-le", "surrogatepass")
    slug = re.sub(r"[^a-z0-9]+", "-", prefix.lower())
    slug = slug.removeprefix("-")
    return slug.removesuffix("-")


def ref_entry_key(title: str | None, content: str) -> str:
    if title is not None and ref_js_trim(title):
        return ref_slugify(title) or "entry-" + ref_stable_hash(title)
    return (ref_slugify(content) or "entry") + "-" + ref_stable_hash(content)


# -- strategies --------------------------------------------------------------------------------

interesting_chars = st.one_of(
    st.characters(),
    st.sampled_from(
        [" ", "\n", "\t", "\u00a0", "\u2028", "\u3000", "-", "A", "z", "9", "🙂", "😀", "İ", "K", *DISPUTED]
    ),
)
texts = st.text(interesting_chars, max_size=80)

json_keys = st.text(max_size=8).filter(lambda k: not is_array_index(k))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(json_keys, children, max_size=4),
    max_leaves=12,
)
tool_names = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10)
parts = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, texts),
    st.builds(lambda t: {"type": "reasoning", "text": t}, texts),
    st.builds(lambda t: {"type": "reasoning", "reasoning": t}, texts),
    st.builds(
        lambda n, i, o: (
            {"type": f"tool-{n}", "toolCallId": "c", "state": "output-available", "input": i}
            | ({} if o is None else {"output": o})
        ),
        tool_names,
        json_values,
        json_values,
    ),
    st.builds(
        lambda n, i, o: {"type": "dynamic-tool", "toolName": n, "toolCallId": "d", "input": i, "output": o},
        tool_names,
        json_values,
        json_values,
    ),
    st.builds(lambda i, r: {"type": "tool-legacy", "input": i, "result": r}, json_values, json_values),
    st.just({"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,AAAA"}),
    st.just({"type": "step-start"}),
    st.builds(lambda t: {"type": "data-note", "text": t}, texts),
    st.builds(lambda r: {"type": "custom", "result": r}, json_values),
)
messages = st.builds(
    lambda i, role, ps: {"id": f"m{i}", "role": role, "parts": ps},
    st.integers(0, 10**6),
    st.sampled_from(["user", "assistant", "system"]),
    st.lists(parts, max_size=5),
)


# -- estimate_string_tokens --------------------------------------------------------------------


def test_constants() -> None:
    assert (CHARS_PER_TOKEN, WORDS_TOKEN_MULTIPLIER, TOKENS_PER_MESSAGE) == (4, 1.3, 4)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        # spec §3
        ("Hello world", 3),
        ("x" * 400, 100),
        ("word " * 50, 65),
        ("a b c d e", 7),
        ("🙂🙂", 2),
        ("User likes coffee.\nUser prefers dark roast.", 11),
        # recorded from the original (golden tokens.json)
        ("", 0),
        (" ", 1),
        ("   \n\t ", 2),
        ("a", 2),
        ("abcd", 2),
        ("abcde", 2),
        ("hello", 2),
        ("hello world", 3),
        ("The quick brown fox jumps over the lazy dog", 12),
        ("a b c d e f g h i j", 13),
        ("x" * 100, 25),
        ('{"key":"value","list":[1,2,3],"nested":{"a":true}}', 13),
        ("function add(a, b) { return a + b; }", 12),
        ("https://example.com/path/to/resource?query=1&other=2", 13),
        ("café naïve résumé", 5),
        ("東京は日本の首都です", 3),
        ("🙂🙂🙂🙂", 2),
        ("line one\nline two\nline three", 8),
        (" ".join(["word"] * 50), 65),
    ],
)
def test_string_vectors(text: str, tokens: int) -> None:
    assert estimate_string_tokens(text) == tokens


def test_none_is_zero() -> None:
    assert estimate_string_tokens(None) == 0


@given(texts)
@example("\ufeff".join(["w"] * 10))  # JS splits on U+FEFF: 10 words → 13
@example("\x1c".join(["w"] * 10))  # JS does not split on U+001C: 1 word
@example("\x85".join(["w"] * 10))
@example("\u180e".join(["w"] * 10))  # no longer whitespace since Unicode 6.3
@example("🙂" * 7)
def test_estimate_matches_the_formula(text: str) -> None:
    assert estimate_string_tokens(text) == ref_estimate(text)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("\ufeff".join(["w"] * 10), 13),
        ("\x1c".join(["w"] * 10), 5),
        ("\x85".join(["w"] * 10), 5),
        ("\u180e".join(["w"] * 10), 5),
    ],
)
def test_word_split_uses_the_js_whitespace_class(text: str, tokens: int) -> None:
    assert estimate_string_tokens(text) == tokens


@given(texts)
@example("🙂")
@example("a\U0010ffffb")
def test_utf16_len_counts_code_units(text: str) -> None:
    assert utf16_len(text) == sum(2 if ord(ch) > 0xFFFF else 1 for ch in text)
    assert utf16_len(text) == len(ref_utf16_units(text))


def test_utf16_len_of_lone_surrogates() -> None:
    assert utf16_len("\ud83d") == 1
    assert utf16_len("a\udc00b") == 3


# -- estimate_message_tokens -------------------------------------------------------------------

GOLDEN_MESSAGES: list[tuple[dict[str, Any], int]] = [
    ({"id": "t1", "role": "user", "parts": [{"type": "text", "text": "hello world"}]}, 7),
    ({"id": "t2", "role": "assistant", "parts": [{"type": "reasoning", "text": "thinking about it"}]}, 9),
    (
        {
            "id": "t3",
            "role": "assistant",
            "parts": [{"type": "reasoning", "reasoning": "legacy reasoning field"}],
        },
        10,
    ),
    (
        {
            "id": "t4",
            "role": "assistant",
            "parts": [
                {
                    "type": "tool-search",
                    "toolCallId": "c1",
                    "state": "output-available",
                    "input": {"q": "weather in paris"},
                    "output": {"temp": 21, "unit": "C"},
                }
            ],
        },
        16,
    ),
    (
        {
            "id": "t5",
            "role": "assistant",
            "parts": [
                {
                    "type": "dynamic-tool",
                    "toolName": "calc",
                    "toolCallId": "c2",
                    "state": "output-available",
                    "input": {"expr": "1+1"},
                    "output": "2",
                }
            ],
        },
        10,
    ),
    (
        {
            "id": "t6",
            "role": "assistant",
            "parts": [{"type": "tool-legacy", "toolCallId": "c3", "input": "raw", "result": "legacy result"}],
        },
        10,
    ),
    (
        {
            "id": "t7",
            "role": "user",
            "parts": [{"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,AAAA"}],
        },
        4,
    ),
    ({"id": "t8", "role": "user", "parts": [{"type": "custom", "text": "custom part with text"}]}, 10),
    ({"id": "t9", "role": "user", "parts": [{"type": "custom", "result": {"any": "thing"}}]}, 8),
    ({"id": "t10", "role": "user", "parts": []}, 4),
    (
        {
            "id": "t11",
            "role": "user",
            "parts": [{"type": "text", "text": "two"}, {"type": "text", "text": "parts here"}],
        },
        9,
    ),
    ({"id": "t12", "role": "user", "parts": [{"type": "step-start"}]}, 4),
]


@pytest.mark.parametrize(("message", "tokens"), GOLDEN_MESSAGES, ids=[m["id"] for m, _ in GOLDEN_MESSAGES])
def test_message_vectors(message: dict[str, Any], tokens: int) -> None:
    assert estimate_message_tokens([message]) == tokens
    assert estimate_message_tokens([Message.from_dict(message)]) == tokens


def test_golden_total_and_empty() -> None:
    assert estimate_message_tokens([m for m, _ in GOLDEN_MESSAGES]) == 101
    assert estimate_message_tokens([]) == 0


@settings(max_examples=200)
@given(st.lists(messages, max_size=6))
def test_message_estimate_is_additive_and_matches_reference(batch: list[dict[str, Any]]) -> None:
    singles = [estimate_message_tokens([m]) for m in batch]
    assert estimate_message_tokens(batch) == sum(singles)
    for message, tokens in zip(batch, singles, strict=True):
        assert tokens >= TOKENS_PER_MESSAGE
        assert tokens == TOKENS_PER_MESSAGE + sum(ref_part_tokens(p) for p in message["parts"])


def test_null_text_and_output_fall_back_like_js_nullish() -> None:
    assert (
        estimate_message_tokens([{"id": "a", "role": "user", "parts": [{"type": "text", "text": None}]}]) == 4
    )
    reasoning = {"type": "reasoning", "text": None, "reasoning": "hello world"}
    assert estimate_message_tokens([{"id": "b", "role": "user", "parts": [reasoning]}]) == 4 + 3
    tool = {"type": "tool-x", "input": None, "output": None, "result": "hello world"}
    assert estimate_message_tokens([{"id": "c", "role": "user", "parts": [tool]}]) == 4 + 3


@pytest.mark.parametrize(
    ("value", "tokens"),
    [
        (None, 0),
        ("", 0),
        ("hello world", 3),
        (False, estimate_string_tokens("false")),
        (0, estimate_string_tokens("0")),
        ({"a": [1, None]}, estimate_string_tokens('{"a":[1,null]}')),
        ({"temp": 21, "unit": "C"}, estimate_string_tokens('{"temp":21,"unit":"C"}')),
    ],
)
def test_value_tokens(value: Any, tokens: int) -> None:
    assert estimate_value_tokens(value) == tokens


# -- js_json ---------------------------------------------------------------------------------


@settings(max_examples=300)
@given(json_values)
def test_js_json_equals_compact_json_dumps_without_floats(value: Any) -> None:
    assert js_json(value) == compact_json(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, "1"),
        (-0.0, "0"),
        (1.5, "1.5"),
        (0.1 + 0.2, "0.30000000000000004"),
        (100.0, "100"),
        (1e20, "100000000000000000000"),
        (2.5e20, "250000000000000000000"),
        (1e21, "1e+21"),
        (-1e21, "-1e+21"),
        (1.5e300, "1.5e+300"),
        (1e-7, "1e-7"),
        (1.5e-7, "1.5e-7"),
        (1.23e-18, "1.23e-18"),
        (0.000001, "0.000001"),
        (0.00001234, "0.00001234"),
        (5e-324, "5e-324"),
        (float("nan"), "null"),
        (float("inf"), "null"),
        (float("-inf"), "null"),
        # Integral doubles past 2**53: JS prints the shortest digits padded with zeros.
        (2.0**60, "1152921504606847000"),
        (9.999999999999999e20, "999999999999999900000"),
        (1.2345678901234568e20, "123456789012345680000"),
    ],
)
def test_js_numbers(value: float, expected: str) -> None:
    assert js_json(value) == expected
    assert ref_js_number(value) == expected


@given(st.floats())
@example(2.0**60)
def test_js_json_floats_follow_number_to_string(value: float) -> None:
    assert js_json(value) == ref_js_number(value)


def test_integer_like_keys_come_first_ascending() -> None:
    value = {"b": 1, "10": 2, "2": 3, "a": 4, "01": 5, "-1": 6, "4294967295": 7, "4294967294": 8, "1.5": 9}
    assert js_json(value) == (
        '{"2":3,"10":2,"4294967294":8,"b":1,"a":4,"01":5,"-1":6,"4294967295":7,"1.5":9}'
    )


def test_js_json_containers_strings_and_dates() -> None:
    assert js_json([1, None, "x", [True, False]]) == '[1,null,"x",[true,false]]'
    assert js_json({"k": 'é🙂\n\t"\\\x00\x1f\u2028'}) == '{"k":"é🙂\\n\\t\\"\\\\\\u0000\\u001f\u2028"}'
    assert js_json("a\ud800b") == '"a\\ud800b"'  # well-formed JSON.stringify escapes lone surrogates
    assert js_json(datetime(2024, 1, 2, 3, 4, 5, 678900, tzinfo=UTC)) == '"2024-01-02T03:04:05.678Z"'


# -- context_entry_key ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("title", "content", "key"),
    [
        # spec §7.6
        (None, "no key", "no-key-1nprufp"),
        (None, "Just content, no desc", "just-content-no-desc-cgko96"),
        (None, "用户喜欢咖啡", "entry-2mzjev"),
        ("Pirate style", "ignored", "pirate-style"),
        ("!!!", "ignored", "entry-ckr8de"),
        ("  ", "hello world", "hello-world-1n91413"),
        # stableHash vectors, seen through the content path
        (None, "", "entry-ztntfp"),
        (None, "a", "a-1r9wi7g"),
        (None, "🙂", "entry-136c4da"),
        # recorded from the original (golden tool_execution.json)
        ("Rollback policy", "Rollbacks take 2 minutes.", "rollback-policy"),
        (
            None,
            "Deployments happen on Tuesdays and Thursdays.",
            "deployments-happen-on-tuesdays-and-thursdays-1bnq2le",
        ),
        ("!!!", "symbol title", "entry-ckr8de"),
        (None, "???", "entry-yciw7o"),
        ("", "no key", "no-key-1nprufp"),
    ],
)
def test_entry_key_vectors(title: str | None, content: str, key: str) -> None:
    assert context_entry_key(title, content) == key
    assert ref_entry_key(title, content) == key


def test_entry_key_cuts_the_slug_at_60_utf16_units_but_hashes_everything() -> None:
    a, b = "a" * 60 + "x", "a" * 60 + "y"
    assert context_entry_key(None, a) != context_entry_key(None, b)
    assert context_entry_key(None, a).startswith("a" * 60 + "-")
    # An emoji is two units: 59 "a" + the emoji's first half fill the 60 units.
    assert context_entry_key(None, "a" * 59 + "🙂b") == "a" * 59 + "-" + ref_stable_hash("a" * 59 + "🙂b")
    # Same title → same key (update in place), whatever the content.
    assert context_entry_key("Deploy runbook", "v1") == context_entry_key("Deploy runbook", "v2")


@pytest.mark.parametrize(
    ("title", "content"),
    [
        # JS trim() removes U+FEFF, so this title is blank: the content decides the key.
        ("\ufeff", "hello"),
        (" \ufeff ", "hello"),
        # JS trim() keeps U+001C..U+001F and U+0085: the title is not blank, its slug is.
        ("\x1c", "hello"),
        ("\x85", "hello"),
    ],
)
def test_entry_key_blank_title_uses_js_trim(title: str, content: str) -> None:
    assert context_entry_key(title, content) == ref_entry_key(title, content)


@settings(max_examples=300)
@given(st.none() | texts, texts)
@example("\ufeff", "hello")
@example("\x1c", "hello")
def test_entry_key_matches_reference(title: str | None, content: str) -> None:
    assert context_entry_key(title, content) == ref_entry_key(title, content)
