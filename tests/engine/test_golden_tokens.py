"""Token estimation against the real original's outputs (``tokens.json``).

``golden-exp.mjs::tokens()`` fed 19 strings to ``estimateStringTokens`` (CJK, emoji, JSON,
whitespace runs, ...) and 12 one-message lists to ``estimateMessageTokens`` (one per part
kind); every value must match ours exactly, as must the constants and the JavaScript string
length (UTF-16 code units) of each input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hub import tokens
from hub.store.overlays import COMPACTION_PREFIX
from hub.tokens import estimate_message_tokens, estimate_string_tokens, utf16_len

GOLDEN: dict[str, Any] = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "golden" / "tokens.json").read_text(encoding="utf-8")
)

STRING_CASES: list[dict[str, Any]] = GOLDEN["estimateStringTokens"]
MESSAGE_CASES: list[dict[str, Any]] = GOLDEN["estimateMessageTokens_each"]


def test_constants() -> None:
    constants = GOLDEN["constants"]
    assert tokens.CHARS_PER_TOKEN == constants["CHARS_PER_TOKEN"] == 4
    assert tokens.WORDS_TOKEN_MULTIPLIER == constants["WORDS_TOKEN_MULTIPLIER"] == 1.3
    assert tokens.TOKENS_PER_MESSAGE == constants["TOKENS_PER_MESSAGE"] == 4
    assert constants["COMPACTION_PREFIX"] == COMPACTION_PREFIX == "compaction_"


def test_recorded_cases_are_all_here() -> None:
    assert len(STRING_CASES) == 19
    assert len(MESSAGE_CASES) == 12


@pytest.mark.parametrize("case", STRING_CASES, ids=[json.dumps(c["input"])[:40] for c in STRING_CASES])
def test_js_length(case: dict[str, Any]) -> None:
    assert utf16_len(case["input"]) == case["jsLength"]


@pytest.mark.parametrize("case", STRING_CASES, ids=[json.dumps(c["input"])[:40] for c in STRING_CASES])
def test_estimate_string_tokens(case: dict[str, Any]) -> None:
    assert estimate_string_tokens(case["input"]) == case["tokens"]


@pytest.mark.parametrize("case", MESSAGE_CASES, ids=[c["message"]["id"] for c in MESSAGE_CASES])
def test_estimate_message_tokens_each(case: dict[str, Any]) -> None:
    assert estimate_message_tokens([case["message"]]) == case["tokens"]


def test_estimate_message_tokens_all() -> None:
    messages = [c["message"] for c in MESSAGE_CASES]
    assert estimate_message_tokens(messages) == GOLDEN["estimateMessageTokens_all"] == 101
    assert sum(c["tokens"] for c in MESSAGE_CASES) == GOLDEN["estimateMessageTokens_all"]


def test_estimate_message_tokens_empty() -> None:
    assert estimate_message_tokens([]) == GOLDEN["estimateMessageTokens_empty"] == 0
