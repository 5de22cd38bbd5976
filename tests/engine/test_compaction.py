"""Compaction: ``Session.compact()``, auto-compaction, ``create_compact_function`` and the
compaction utilities.

The catalogue cases of the original (spec §16.1: ``Session.compact()``,
``createCompactFunction``, the DO-backed "iterative compaction filters synthetic
compaction_ IDs", ``utils/compaction.test.ts``) on a real SQLite store, then our
departures (blank summaries, structured tool outputs in the prompt, spans deleted while
the summarizer works), races with appends while the summarizer works, and tool-call
boundaries for every tool-part shape.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hub import InvalidInput, InvalidMessage, Message, ReadonlyText, Session, SessionManager, SqliteStore
from hub.compaction import (
    STUB_RESULT,
    CompactContext,
    CompactResult,
    build_summary_prompt,
    create_compact_function,
    sanitize_tool_pairs,
    truncate_older_messages,
    truncate_tool_output,
)
from hub.store.overlays import COMPACTION_PREFIX
from hub.tokens import estimate_message_tokens, js_json
from tests.support.hubtest import text_message

# -- helpers --------------------------------------------------------------------------------


def numbered(n: int, text: str = "msg {i}", prefix: str = "m") -> list[dict[str, Any]]:
    """``m0..m{n-1}``, alternating user / assistant, as the original's tests build them."""
    return [
        text_message(f"{prefix}{i}", "user" if i % 2 == 0 else "assistant", text.format(i=i))
        for i in range(n)
    ]


def long_conversation(n: int, words: int = 12) -> list[dict[str, Any]]:
    """c1..cn, each about 23 heuristic tokens (golden-exp.mjs ``longConversation``)."""
    return [
        text_message(
            f"c{i}",
            "user" if i % 2 else "assistant",
            f"turn {i} " + " ".join(f"w{i}_{k}" for k in range(words)),
        )
        for i in range(1, n + 1)
    ]


def as_messages(dicts: list[dict[str, Any]]) -> list[Message]:
    return [Message.from_dict(d) for d in dicts]


def ids(messages: list[Message]) -> list[str]:
    return [m.id for m in messages]


async def append_all(session: Session, messages: list[dict[str, Any]]) -> None:
    for m in messages:
        await session.append_message(m)


async def status_events(session: Session, after_seq: int = 0) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, e.data) for e in await session.read_events(after_seq) if e.type in ("status", "error")]


async def last_seq(session: Session) -> int:
    events = await session.read_events()
    return events[-1].seq if events else 0


def overlay_ids(history: list[Message]) -> list[str]:
    return [m.id for m in history if m.id.startswith(COMPACTION_PREFIX)]


class Recorder:
    """A compaction function returning a fixed result and recording what it was given."""

    def __init__(self, result: CompactResult | dict[str, Any] | None) -> None:
        self.result = result
        self.calls: list[list[str]] = []
        self.contexts: list[CompactContext] = []

    async def __call__(self, messages: list[Message], context: CompactContext) -> Any:
        self.calls.append(ids(messages))
        self.contexts.append(context)
        return self.result


class MemoryProvider:
    """A writable in-memory context provider (the original tests' ``MemoryBlockProvider``)."""

    def __init__(self, value: str | None = None) -> None:
        self.value = value

    async def get(self) -> str | None:
        return self.value

    async def set(self, content: str) -> None:
        self.value = content


class Gate:
    """A summarizer that waits, mid-call, until the test releases it."""

    def __init__(self, summary: str = "GATED SUMMARY") -> None:
        self.summary = summary
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.prompts: list[str] = []

    async def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        self.entered.set()
        await self.release.wait()
        return self.summary


def fail_compactions(db_path: Path, message: str = "storage unavailable") -> None:
    """Make every insert into ``compactions`` fail, for real, with a trigger."""
    conn = sqlite3.connect(db_path)
    try:
        conn.execute(
            f"CREATE TRIGGER fail_compactions BEFORE INSERT ON compactions "
            f"BEGIN SELECT RAISE(ABORT, '{message}'); END"
        )
        conn.commit()
    finally:
        conn.close()


# == Session.compact() (catalogue) ==========================================================


async def test_compact_without_function_raises(store: SqliteStore) -> None:
    s = Session(store)
    await s.append_message(text_message("m0", "user", "hi"))
    with pytest.raises(InvalidInput, match="No compaction function registered"):
        await s.compact()
    assert await s.get_compactions() == []


async def test_compact_delegates_minimum_check_to_function(store: SqliteStore) -> None:
    fn = Recorder(None)  # the function decides there is nothing to compact
    s = Session(store).on_compaction(fn)
    await s.append_message(text_message("m1", "user", "hi"))
    await s.append_message(text_message("m2", "assistant", "hey"))
    assert await s.compact() is None
    assert fn.calls == [["m1", "m2"]]
    assert await s.get_compactions() == []


async def test_compact_returns_none_when_function_returns_none(store: SqliteStore) -> None:
    fn = Recorder(None)
    s = Session(store).on_compaction(fn)
    await append_all(s, numbered(6))
    assert await s.compact() is None
    assert await s.get_compactions() == []
    assert ids(await s.get_history()) == [f"m{i}" for i in range(6)]


@pytest.mark.parametrize(
    "returned",
    [
        CompactResult("m1", "m3", "Summary of m1-m3"),
        {"fromMessageId": "m1", "toMessageId": "m3", "summary": "Summary of m1-m3"},
        {"from_message_id": "m1", "to_message_id": "m3", "summary": "Summary of m1-m3"},
    ],
    ids=["CompactResult", "camelCase-dict", "snake_case-dict"],
)
async def test_compact_stores_overlay_from_result(
    store: SqliteStore, returned: CompactResult | dict[str, Any]
) -> None:
    s = Session(store).on_compaction(Recorder(returned))
    await append_all(s, numbered(6))
    result = await s.compact()
    assert result == CompactResult("m1", "m3", "Summary of m1-m3")
    [c] = await s.get_compactions()
    assert (c.summary, c.from_message_id, c.to_message_id) == ("Summary of m1-m3", "m1", "m3")
    history = await s.get_history()
    assert ids(history) == ["m0", COMPACTION_PREFIX + c.id, "m4", "m5"]
    assert history[1].parts == [{"type": "text", "text": "Summary of m1-m3"}]


async def test_compact_explicit_branch_does_not_extend_sibling_overlay(store: SqliteStore) -> None:
    """``compact("m2")`` passes ``[m0, m1, m2]``; the overlay m0→old-assistant lies on a
    sibling branch, so the new overlay starts where the result says (m1), not at m0."""
    fn = Recorder(CompactResult("m1", "m1", "branch summary"))
    s = Session(store).on_compaction(fn)
    await s.append_message(text_message("m0", "user", "root"))
    await s.append_message(text_message("m1", "assistant", "first answer"))
    await s.append_message(text_message("m2", "user", "follow-up"))
    await s.append_message(text_message("old-assistant", "assistant", "another answer"), "m0")
    sibling = await s.add_compaction("sibling summary", "m0", "old-assistant")
    assert ids(await s.get_history()) == [COMPACTION_PREFIX + sibling.id]

    result = await s.compact("m2")
    assert fn.calls == [["m0", "m1", "m2"]]
    assert result == CompactResult("m1", "m1", "branch summary")
    compactions = await s.get_compactions()
    assert [(c.from_message_id, c.to_message_id) for c in compactions] == [
        ("m0", "old-assistant"),
        ("m1", "m1"),
    ]
    assert ids(await s.get_history("m2")) == ["m0", COMPACTION_PREFIX + compactions[1].id, "m2"]
    # The sibling branch still reads with its own overlay only.
    assert ids(await s.get_history("old-assistant")) == [COMPACTION_PREFIX + sibling.id]


async def test_iterative_compaction_extends_from_earliest_overlay(store: SqliteStore) -> None:
    s = Session(store).on_compaction(Recorder(CompactResult("m6", "m8", "Round 2")))
    await append_all(s, numbered(10))
    await s.add_compaction("Round 1", "m1", "m5")
    result = await s.compact()
    assert result == CompactResult("m1", "m8", "Round 2")
    compactions = await s.get_compactions()
    assert len(compactions) == 2
    latest = compactions[-1]
    assert (latest.from_message_id, latest.to_message_id, latest.summary) == ("m1", "m8", "Round 2")
    assert ids(await s.get_history()) == ["m0", COMPACTION_PREFIX + latest.id, "m9"]


async def test_iterative_compaction_with_overlay_messages_in_history(store: SqliteStore) -> None:
    """The function sees the overlay (filtering it is its job); the session stores real ids,
    extended from the existing overlay's start."""
    fn = Recorder(CompactResult("m4", "m5", "Round 2 summary"))
    s = Session(store).on_compaction(fn)
    await append_all(s, numbered(8, "message {i}"))
    first = await s.add_compaction("Previous summary", "m1", "m3")
    result = await s.compact()
    assert fn.calls == [["m0", COMPACTION_PREFIX + first.id, "m4", "m5", "m6", "m7"]]
    assert result == CompactResult("m1", "m5", "Round 2 summary")
    compactions = await s.get_compactions()
    assert len(compactions) == 2
    assert (compactions[1].from_message_id, compactions[1].to_message_id) == ("m1", "m5")
    assert compactions[1].summary == "Round 2 summary"
    assert ids(await s.get_history()) == ["m0", COMPACTION_PREFIX + compactions[1].id, "m6", "m7"]


async def test_compact_emits_compacting_then_idle_with_compacted(store: SqliteStore) -> None:
    s = Session(store).on_compaction(Recorder(CompactResult("m1", "m3", "Compacted")))
    await append_all(s, numbered(6))
    seq = await last_seq(s)
    await s.compact()
    events = await status_events(s, seq)
    assert len(events) == 2
    (kind1, starting), (kind2, complete) = events
    assert kind1 == kind2 == "status"
    assert starting["phase"] == "compacting"
    assert starting["token_estimate"] > 0
    assert complete["phase"] == "idle"
    assert complete["compacted"]["tokens_before"] == starting["token_estimate"] > 0
    assert complete["token_estimate"] < starting["token_estimate"]
    assert starting["token_threshold"] is complete["token_threshold"] is None


async def test_compact_result_outside_history_is_ignored(store: SqliteStore) -> None:
    s = Session(store).on_compaction(Recorder(CompactResult("m1", "nope", "bad span")))
    await append_all(s, numbered(4))
    seq = await last_seq(s)
    assert await s.compact() is None
    assert await s.get_compactions() == []
    assert [(k, d["phase"]) for k, d in await status_events(s, seq)] == [
        ("status", "compacting"),
        ("status", "idle"),
    ]


# == auto-compaction (catalogue) ============================================================


async def test_append_auto_compacts_above_threshold(store: SqliteStore) -> None:
    fn = Recorder(CompactResult("m1", "m3", "Auto-compacted"))
    s = Session(store)
    await append_all(s, numbered(4, "message {i} with some content"))
    s.on_compaction(fn).compact_after(10)
    await s.append_message(text_message("m4", "user", "this should trigger compaction"))
    assert len(fn.calls) == 1
    [c] = await s.get_compactions()
    assert c.summary == "Auto-compacted"
    assert ids(await s.get_history()) == ["m0", COMPACTION_PREFIX + c.id, "m4"]


async def test_append_does_not_auto_compact_below_threshold(store: SqliteStore) -> None:
    fn = Recorder(CompactResult("m0", "m0", "should not happen"))
    s = Session(store).on_compaction(fn).compact_after(1_000_000)
    await s.append_message(text_message("m0", "user", "short"))
    assert fn.calls == []
    assert await s.get_compactions() == []


async def test_append_does_not_auto_compact_without_threshold(store: SqliteStore) -> None:
    fn = Recorder(CompactResult("m0", "m3", "should not happen"))
    s = Session(store).on_compaction(fn)
    await append_all(s, numbered(10, "message {i}"))
    await s.append_message(text_message("m10", "user", "no threshold set"))
    assert fn.calls == []
    assert await s.get_compactions() == []
    # Without auto-compaction configured, appends log no status at all.
    assert await status_events(s) == []


async def test_append_does_not_auto_compact_without_function(store: SqliteStore) -> None:
    s = Session(store).compact_after(10)
    await append_all(s, numbered(6, "message {i} with plenty of words in it"))
    assert len(await s.get_history()) == 6
    assert await s.get_compactions() == []
    # A threshold alone still reports the fill level after each append, and never compacts.
    statuses = await status_events(s)
    assert [d["phase"] for _, d in statuses] == ["idle"] * 6
    assert statuses[-1][1] == {
        "phase": "idle",
        "token_estimate": await s.estimate_tokens(),
        "token_threshold": 10,
    }


async def test_auto_compaction_estimate_includes_system_prompt(store: SqliteStore) -> None:
    fn = Recorder(CompactResult("m0", "m1", "context-triggered"))
    s = (
        Session(store)
        .with_context("big", provider=ReadonlyText("x" * 400))
        .on_compaction(fn)
        .compact_after(50)
    )
    await store.append_messages("", as_messages([text_message("m0", "user", "short")]), None)
    await s.append_message(text_message("m1", "assistant", "ok"))
    assert len(fn.calls) == 1
    assert [c.summary for c in await s.get_compactions()] == ["context-triggered"]


async def test_auto_compaction_without_the_prompt_stays_below(store: SqliteStore) -> None:
    """The contrast for the case above: the same two messages alone are far below 50."""
    fn = Recorder(CompactResult("m0", "m1", "context-triggered"))
    s = Session(store).on_compaction(fn).compact_after(50)
    await s.append_message(text_message("m0", "user", "short"))
    await s.append_message(text_message("m1", "assistant", "ok"))
    assert fn.calls == []
    assert await s.estimate_tokens() <= 50


@pytest.mark.parametrize("threshold", [1_000_000, 1], ids=["below", "above-but-function-returns-none"])
async def test_auto_compaction_estimates_never_persist_a_cached_prompt(
    store: SqliteStore, threshold: int
) -> None:
    fn = Recorder(None)
    s = (
        Session(store)
        .with_context("soul", provider=ReadonlyText("do not persist during estimate"))
        .with_cached_prompt()
        .on_compaction(fn)
        .compact_after(threshold)
    )
    await s.append_message(text_message("m1", "user", "hello"))
    await s.append_message(text_message("m2", "assistant", "hello back"))
    assert len(fn.calls) == (0 if threshold > 1 else 2)
    assert await store.get_context_value("_system_prompt") is None
    assert [e.type for e in await s.read_events()].count("prompt.updated") == 0


async def test_auto_compaction_estimates_reuse_a_frozen_prompt(store: SqliteStore) -> None:
    provider = MemoryProvider("x" * 400)
    fn = Recorder(CompactResult("m0", "m1", "frozen prompt counted"))
    s = Session(store).with_context("memory", provider=provider)
    await s.append_message(text_message("m0", "user", "short"))
    await s.freeze_system_prompt()
    await provider.set("short")
    # The frozen (big) prompt still counts; a session that never froze it counts the
    # current, short one.
    fresh = Session(store).with_context("memory", provider=MemoryProvider("short"))
    assert await fresh.estimate_tokens() <= 50 < await s.estimate_tokens()
    s.on_compaction(fn).compact_after(50)
    await s.append_message(text_message("m1", "assistant", "ok"))
    assert len(fn.calls) == 1


async def test_custom_token_counter_gets_messages_prompt_and_blocks(store: SqliteStore) -> None:
    seen: list[dict[str, Any]] = []

    def counter(data: dict[str, Any]) -> int:
        seen.append(data)
        return 11

    fn = Recorder(CompactResult("m0", "m1", "custom-counter"))
    s = (
        Session(store)
        .with_context("memory", provider=ReadonlyText("remember this"))
        .on_compaction(fn)
        .compact_after(10, token_counter=counter)
    )
    await store.append_messages("", as_messages([text_message("m0", "user", "short")]), None)
    await s.append_message(text_message("m1", "assistant", "ok"))
    first = seen[0]
    assert set(first) == {"messages", "system_prompt", "context_blocks"}
    assert ids(first["messages"]) == ["m0", "m1"]
    assert "remember this" in first["system_prompt"]
    assert first["context_blocks"][0].label == "memory"
    assert len(fn.calls) == 1
    # The counter is flowed to the compaction function too.
    assert fn.contexts[0].token_counter is counter


async def test_custom_counter_gets_cached_prompt_and_loaded_blocks(store: SqliteStore) -> None:
    inputs: list[tuple[int, str, list[str], list[str]]] = []

    def counter(data: dict[str, Any]) -> int:
        blocks = data["context_blocks"]
        inputs.append(
            (
                len(data["messages"]),
                data["system_prompt"],
                [b.label for b in blocks],
                [b.content for b in blocks],
            )
        )
        return 11

    s = (
        Session(store)
        .with_context("memory", provider=ReadonlyText("current block content"))
        .with_cached_prompt(MemoryProvider("cached frozen prompt"))
        .on_compaction(Recorder(CompactResult("m0", "m1", "cached prompt counter")))
        .compact_after(10, token_counter=counter)
    )
    await store.append_messages("", as_messages([text_message("m0", "user", "short")]), None)
    await s.append_message(text_message("m1", "assistant", "ok"))
    assert (2, "cached frozen prompt", ["memory"], ["current block content"]) in inputs
    assert [c.summary for c in await s.get_compactions()] == ["cached prompt counter"]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
async def test_non_finite_counter_result_counts_as_zero(store: SqliteStore, value: float) -> None:
    fn = Recorder(CompactResult("m0", "m0", "should not happen"))
    s = Session(store).on_compaction(fn).compact_after(1, token_counter=lambda data: value)
    await s.append_message(text_message("m0", "user", "short"))
    assert fn.calls == []
    assert await s.estimate_tokens() == 0
    assert await status_events(s) == [
        ("status", {"phase": "idle", "token_estimate": 0, "token_threshold": 1})
    ]


async def test_reasoning_parts_are_counted(store: SqliteStore) -> None:
    reasoning = {"type": "reasoning", "text": "Let me think through the constraints carefully."}
    with_reasoning = estimate_message_tokens([{"id": "m1", "role": "assistant", "parts": [reasoning]}])
    without = estimate_message_tokens([{"id": "m1", "role": "assistant", "parts": []}])
    assert with_reasoning > without
    s = Session(store)
    await s.append_message({"id": "m1", "role": "assistant", "parts": []})
    before = await s.estimate_tokens()
    await s.append_message({"id": "m2", "role": "assistant", "parts": [reasoning]})
    assert await s.estimate_tokens() - before == with_reasoning


async def test_on_compaction_error_gets_the_storage_failure(store: SqliteStore, db_path: Path) -> None:
    errors: list[BaseException] = []
    s = (
        Session(store)
        .on_compaction(Recorder(CompactResult("m0", "m1", "will fail")))
        .on_compaction_error(errors.append)
        .compact_after(1)
    )
    await store.append_messages(
        "", as_messages([text_message("m0", "user", "enough tokens to trigger")]), None
    )
    fail_compactions(db_path)
    assert await s.append_message(text_message("m1", "assistant", "ok")) is True
    assert len(errors) == 1
    assert isinstance(errors[0], Exception)
    assert "storage unavailable" in str(errors[0])
    assert await s.get_compactions() == []
    assert ids(await s.get_history()) == ["m0", "m1"]
    assert (await status_events(s))[-1] == ("error", {"error": str(errors[0])})


async def test_append_stays_non_fatal_when_the_error_handler_raises(
    store: SqliteStore, db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def handler(exc: BaseException) -> None:
        raise RuntimeError("logger unavailable")

    s = (
        Session(store)
        .on_compaction(Recorder(CompactResult("m0", "m1", "will fail")))
        .on_compaction_error(handler)
        .compact_after(1)
    )
    await store.append_messages(
        "", as_messages([text_message("m0", "user", "enough tokens to trigger")]), None
    )
    fail_compactions(db_path)
    with caplog.at_level(logging.WARNING, logger="sessionhub.session"):
        assert await s.append_message(text_message("m1", "assistant", "ok")) is True
    assert ids(await s.get_history()) == ["m0", "m1"]
    assert "Session auto-compaction error handler failed: logger unavailable" in caplog.text


async def test_auto_compaction_without_handler_logs_and_continues(
    store: SqliteStore, db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = Session(store).on_compaction(Recorder(CompactResult("m0", "m1", "will fail"))).compact_after(1)
    await store.append_messages(
        "", as_messages([text_message("m0", "user", "enough tokens to trigger")]), None
    )
    fail_compactions(db_path)
    with caplog.at_level(logging.WARNING, logger="sessionhub.session"):
        await s.append_message(text_message("m1", "assistant", "ok"))
    assert "Session auto-compaction failed: " in caplog.text
    assert "storage unavailable" in caplog.text


async def test_auto_compaction_null_result_warns_once(
    store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    s = Session(store).on_compaction(Recorder(None)).compact_after(1)
    with caplog.at_level(logging.WARNING, logger="sessionhub.session"):
        await append_all(s, numbered(3))
    warnings = [r for r in caplog.records if "Auto-compaction fired" in r.getMessage()]
    assert len(warnings) == 1


# == SessionManager ==========================================================================


async def test_manager_iterative_compaction_filters_synthetic_ids(store: SqliteStore) -> None:
    """The original's DO-backed test: the second overlay starts at the first one's start
    (never at the synthetic ``compaction_`` id) and supersedes it."""
    mgr = SessionManager(store)
    info = await mgr.create("CompactTest")
    session = mgr.get_session(info.id)
    await append_all(session, numbered(10, prefix="cm-"))
    await session.add_compaction("Summary round 1", "cm-1", "cm-7")
    history = await session.get_history()
    assert any(m.id.startswith(COMPACTION_PREFIX) for m in history)
    for m in numbered(15, prefix="cm-")[10:]:
        await session.append_message(m)
    history = await session.get_history()
    existing = await session.get_compactions()
    real = [m for m in history if not m.id.startswith(COMPACTION_PREFIX)]
    from_id = existing[0].from_message_id if existing else real[1].id
    await session.add_compaction("Summary round 2", from_id, "cm-12")

    history = await session.get_history()
    assert history[0].id == "cm-0"
    summaries = [m for m in history if m.id.startswith(COMPACTION_PREFIX)]
    assert len(summaries) == 1
    assert "Summary round 2" in "".join(p["text"] for p in summaries[0].parts if p["type"] == "text")
    assert [m.id for m in history if m not in summaries and m.id != "cm-0"] == ["cm-13", "cm-14"]


async def test_manager_append_triggers_auto_compaction(store: SqliteStore) -> None:
    prompts: list[str] = []

    async def summarize(prompt: str) -> str:
        prompts.append(prompt)
        return "MANAGED SUMMARY"

    mgr = SessionManager(store).on_compaction(create_compact_function(summarize, tail_token_budget=60))
    mgr.compact_after(150)
    info = await mgr.create("auto")
    other = await mgr.create("other")
    for m in long_conversation(7):
        await mgr.append(info.id, m)
    [c] = await mgr.get_compactions(info.id)
    assert (c.from_message_id, c.to_message_id, c.summary) == ("c4", "c5", "MANAGED SUMMARY")
    assert ids(await mgr.get_history(info.id)) == ["c1", "c2", "c3", COMPACTION_PREFIX + c.id, "c6", "c7"]
    assert len(prompts) == 1
    # Another managed session is untouched.
    assert await mgr.get_compactions(other.id) == []


# == create_compact_function (catalogue) =====================================================


async def stub_summarize(prompt: str) -> str:
    return "summary"


class CountingSummarizer:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, prompt: str) -> str:
        self.calls += 1
        return "summary"


async def test_create_compact_function_too_few_messages() -> None:
    summarize = CountingSummarizer()
    fn = create_compact_function(summarize, protect_head=2, min_tail_messages=4)
    # 6 messages <= protect_head (2) + min_tail_messages (4)
    assert await fn(as_messages(numbered(6, "message {i}")), CompactContext()) is None
    assert summarize.calls == 0


async def test_create_compact_function_enough_messages() -> None:
    fn = create_compact_function(stub_summarize, protect_head=1, min_tail_messages=2, tail_token_budget=10)
    messages = as_messages(numbered(20, "message {i} with enough content to have tokens"))
    result = CompactResult.coerce(await fn(messages, CompactContext()))
    assert result is not None
    assert result.summary == "summary"
    assert result.from_message_id.startswith("m") and result.to_message_id.startswith("m")
    # Head m0 kept; the newest message always stays, and min_tail_messages keeps m18 too.
    assert (result.from_message_id, result.to_message_id) == ("m1", "m17")


async def test_create_compact_function_takes_uimessage_dicts() -> None:
    """As every other entry point: a port passes the UIMessage dicts it has."""
    fn = create_compact_function(stub_summarize, protect_head=1, min_tail_messages=2, tail_token_budget=10)
    dicts = numbered(20, "message {i} with enough content to have tokens")
    from_dicts = CompactResult.coerce(await fn(dicts, CompactContext()))  # type: ignore[arg-type]
    from_messages = CompactResult.coerce(await fn(as_messages(dicts), CompactContext()))
    assert from_dicts is not None and from_dicts == from_messages
    assert (from_dicts.from_message_id, from_dicts.to_message_id) == ("m1", "m17")
    with pytest.raises(InvalidMessage, match="parts"):
        await fn([{"id": "x", "role": "user"}] * 20, CompactContext())  # type: ignore[list-item]


def tool_heavy(n: int, output: Callable[[int], Any]) -> list[Message]:
    return as_messages(
        [
            text_message("head", "user", "start"),
            *(
                {
                    "id": f"tool-{i}",
                    "role": "assistant",
                    "parts": [
                        {
                            "type": "tool-read_many",
                            "toolCallId": f"call-{i}",
                            "toolName": "read_many",
                            "state": "output-available",
                            "input": {"glob": "**/*.ts"},
                            "output": output(i),
                        }
                    ],
                }
                for i in range(n)
            ),
        ]
    )


async def test_heuristic_under_count_can_skip_tool_heavy_histories() -> None:
    """Documents the original's failure mode: a budget just above the heuristic's size of
    the tail protects everything, although a model would count far more."""

    def output(i: int) -> list[dict[str, Any]]:
        return [
            {
                "file": f"/repo/file-{i}-{j}.ts",
                "line": j,
                "snippet": f"export const value{j} = "
                + js_json({"nested": ["alpha", "beta", "gamma"], "enabled": True})
                + ";",
            }
            for j in range(120)
        ]

    messages = tool_heavy(8, output)
    heuristic = estimate_message_tokens(messages[1:])
    budget = heuristic + 1
    assert heuristic * 5 > budget
    summarize = CountingSummarizer()
    fn = create_compact_function(summarize, protect_head=1, min_tail_messages=1, tail_token_budget=budget)
    assert await fn(messages, CompactContext()) is None
    assert summarize.calls == 0


async def test_supplied_token_counter_sizes_the_tail() -> None:
    messages = tool_heavy(8, lambda i: "x" * 25_000)
    summarize = CountingSummarizer()
    seen: list[list[str]] = []

    def counter(msgs: list[Message]) -> int:
        seen.append(ids(msgs))
        return sum(len(js_json(m.parts)) for m in msgs)

    fn = create_compact_function(
        summarize, protect_head=1, min_tail_messages=1, tail_token_budget=10_000, token_counter=counter
    )
    result = CompactResult.coerce(await fn(messages, CompactContext()))
    assert result is not None
    assert (result.from_message_id, result.summary) == ("tool-0", "summary")
    assert summarize.calls == 1
    # Called once per message, newest first.
    assert seen[:2] == [["tool-7"], ["tool-6"]]


async def test_session_flowed_counter_via_compact_context() -> None:
    messages = tool_heavy(8, lambda i: "x" * 4000)
    heuristic = estimate_message_tokens(messages[1:])
    summarize = CountingSummarizer()
    fn = create_compact_function(
        summarize, protect_head=1, min_tail_messages=1, tail_token_budget=heuristic + 1
    )
    # No explicit counter and none in the context: the heuristic protects the whole tail.
    assert await fn(messages, CompactContext()) is None
    assert summarize.calls == 0

    inputs: list[dict[str, Any]] = []

    def session_counter(data: dict[str, Any]) -> int:
        inputs.append(data)
        return estimate_message_tokens(data["messages"]) * 5

    result = CompactResult.coerce(await fn(messages, CompactContext(token_counter=session_counter)))
    assert result is not None and result.summary == "summary"
    assert summarize.calls == 1
    # The whole-prompt counter is called per message with an empty prompt and no blocks.
    assert all(set(d) == {"messages", "system_prompt", "context_blocks"} for d in inputs)
    assert all(
        len(d["messages"]) == 1 and d["system_prompt"] == "" and d["context_blocks"] == [] for d in inputs
    )


async def test_session_passes_its_counter_to_create_compact_function(store: SqliteStore) -> None:
    """End to end: ``compact_after(..., token_counter=f)`` sizes the function's tail."""
    summarize = CountingSummarizer()
    fn = create_compact_function(summarize, protect_head=1, min_tail_messages=1, tail_token_budget=100)
    calls: list[int] = []

    def counter(data: dict[str, Any]) -> int:
        calls.append(len(data["messages"]))
        return 60 * len(data["messages"])

    s = Session(store).on_compaction(fn).compact_after(1_000_000, token_counter=counter)
    await append_all(s, numbered(6, "m {i}"))
    result = await s.compact()
    # 60 per message, budget 100: only the newest message fits the tail.
    assert result == CompactResult("m1", "m4", "summary")
    assert 1 in calls


# == departures ==============================================================================


@pytest.mark.parametrize("summary", ["", "  ", "\n\t "], ids=["empty", "spaces", "whitespace"])
async def test_blank_summary_from_the_function_stores_nothing(store: SqliteStore, summary: str) -> None:
    fn = Recorder({"from_message_id": "m1", "to_message_id": "m3", "summary": summary})
    s = Session(store).on_compaction(fn)
    await append_all(s, numbered(6))
    seq = await last_seq(s)
    assert await s.compact() is None
    assert await s.get_compactions() == []
    assert ids(await s.get_history()) == [f"m{i}" for i in range(6)]
    events = await status_events(s, seq)
    assert events[0][1]["phase"] == "compacting"
    errors = [d for k, d in events if k == "error"]
    assert len(errors) == 1 and "empty summary" in errors[0]["error"]


async def test_blank_summary_from_the_summarizer_returns_none() -> None:
    async def blank(prompt: str) -> str:
        return " \n "

    fn = create_compact_function(blank, tail_token_budget=60)
    assert await fn(as_messages(long_conversation(12)), CompactContext()) is None


def weather_messages() -> list[Message]:
    return as_messages(
        [
            {
                "id": "a1",
                "role": "assistant",
                "parts": [
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool-weather",
                        "toolCallId": "w1",
                        "toolName": "weather",
                        "state": "output-available",
                        "input": {"city": "Zürich"},
                        "output": {"temp": 21, "unit": "C"},
                    },
                    {
                        "type": "dynamic-tool",
                        "toolCallId": "w2",
                        "toolName": "forecast",
                        "state": "output-available",
                        "input": {"days": 2},
                        "output": [{"day": 1, "sky": "clear"}, {"day": 2, "sky": "rain"}],
                    },
                ],
            }
        ]
    )


def test_structured_tool_outputs_appear_as_compact_json() -> None:
    prompt = build_summary_prompt(weather_messages(), None, 100)
    assert (
        "[assistant]\nChecking.\n"
        "[Tool: weather]\n"
        'Input: {"city":"Zürich"}\n'
        'Output: {"temp":21,"unit":"C"}\n'
        "[Tool: forecast]\n"
        'Input: {"days":2}\n'
        'Output: [{"day":1,"sky":"clear"},{"day":2,"sky":"rain"}]'
    ) in prompt
    assert "[object Object]" not in prompt


async def test_structured_tool_output_reaches_the_summarizer_as_json() -> None:
    prompts: list[str] = []

    async def summarize(prompt: str) -> str:
        prompts.append(prompt)
        return "S"

    messages = as_messages(long_conversation(12))
    messages[4:5] = weather_messages()
    fn = create_compact_function(summarize, tail_token_budget=60)
    assert await fn(messages, CompactContext()) is not None
    assert 'Output: {"temp":21,"unit":"C"}' in prompts[0]
    assert "[object Object]" not in prompts[0]


def test_long_structured_output_is_clipped_to_500_chars() -> None:
    big = {"rows": list(range(400))}
    message = Message.from_dict(
        {
            "id": "a1",
            "role": "assistant",
            "parts": [{"type": "tool-q", "toolCallId": "q", "toolName": "q", "output": big}],
        }
    )
    prompt = build_summary_prompt([message], None, 100)
    assert "Output: " + js_json(big)[:500] + "\n\nUse this structure:" in prompt


async def compact_while_deleting(
    store: SqliteStore, victim: str
) -> tuple[Session, CompactResult | None, int]:
    gate = Gate()
    s = Session(store).on_compaction(create_compact_function(gate, tail_token_budget=60))
    await append_all(s, long_conversation(12))
    seq = await last_seq(s)
    task = asyncio.create_task(s.compact())
    await gate.entered.wait()
    # The summarizer is working on c4..c10; another caller deletes part of that span.
    assert await Session(store).delete_messages([victim]) == [victim]
    gate.release.set()
    return s, await task, seq


@pytest.mark.parametrize("victim", ["c4", "c6", "c10"], ids=["span-start", "inside-span", "span-end"])
async def test_compaction_of_a_span_deleted_meanwhile_is_refused(store: SqliteStore, victim: str) -> None:
    """The summary describes c4..c10 as the summarizer saw them; once one of them is deleted
    the summary no longer matches the stored span, so no overlay may be laid (a deleted
    message must not come back through its summary)."""
    s, result, seq = await compact_while_deleting(store, victim)
    assert result is None
    assert await s.get_compactions() == []
    assert overlay_ids(await s.get_history()) == []
    errors = [d["error"] for k, d in await status_events(s, seq) if k == "error"]
    assert len(errors) == 1
    assert "c4" in errors[0] and "c10" in errors[0]


# == races: appends while the summarizer works ===============================================


async def test_appends_while_summarizing_are_kept_after_the_overlay(store: SqliteStore) -> None:
    gate = Gate()
    s = Session(store).on_compaction(create_compact_function(gate, tail_token_budget=60))
    await append_all(s, long_conversation(12))
    task = asyncio.create_task(s.compact())
    await gate.entered.wait()
    for i in range(3):
        assert await s.append_message(text_message(f"n{i}", "user", f"new message {i}")) is True
    gate.release.set()
    result = await task

    assert result == CompactResult("c4", "c10", "GATED SUMMARY")
    # The summarizer saw c4..c10 and nothing appended later.
    assert "turn 10 " in gate.prompts[0] and "turn 11 " not in gate.prompts[0]
    assert "new message" not in gate.prompts[0]
    [c] = await s.get_compactions()
    assert (c.from_message_id, c.to_message_id) == ("c4", "c10")
    assert ids(await s.get_history()) == [
        "c1",
        "c2",
        "c3",
        COMPACTION_PREFIX + c.id,
        "c11",
        "c12",
        "n0",
        "n1",
        "n2",
    ]
    assert await s.get_path_length() == 15


BRANCH_HISTORIES = {
    # parent of the new branch → its history once the overlay is laid
    "c2": ["c1", "c2", "b1"],  # branches before the span: shares none of it
    "c6": ["c1", "c2", "c3", "c4", "c5", "c6", "b1"],  # inside the span: shares only part
    "c11": ["c1", "c2", "c3", "<overlay>", "c11", "b1"],  # after the span: shares all of it
}


@pytest.mark.parametrize("parent", list(BRANCH_HISTORIES))
async def test_branch_appended_while_summarizing_keeps_its_history(store: SqliteStore, parent: str) -> None:
    """A sibling branch appended while the summarizer works becomes the latest leaf. The
    overlay is still laid on the branch that was summarized (c1..c12); the new branch shows
    it only if it contains the whole span c4..c10 (those messages are then its own too)."""
    gate = Gate()
    s = Session(store).on_compaction(create_compact_function(gate, tail_token_budget=60))
    await append_all(s, long_conversation(12))
    task = asyncio.create_task(s.compact())
    await gate.entered.wait()
    await s.append_message(text_message("b1", "user", "a new branch"), parent)
    latest = await s.get_latest_leaf()
    assert latest is not None and latest.id == "b1"
    gate.release.set()
    result = await task

    assert result == CompactResult("c4", "c10", "GATED SUMMARY")
    assert "a new branch" not in gate.prompts[0]
    [c] = await s.get_compactions()
    assert (c.from_message_id, c.to_message_id) == ("c4", "c10")
    overlay = COMPACTION_PREFIX + c.id
    assert ids(await s.get_history("c12")) == ["c1", "c2", "c3", overlay, "c11", "c12"]
    expected = [overlay if i == "<overlay>" else i for i in BRANCH_HISTORIES[parent]]
    assert ids(await s.get_history("b1")) == expected
    assert ids(await s.get_history()) == expected


async def test_compacted_status_describes_the_compacted_branch(store: SqliteStore) -> None:
    """``compacted.tokens_before`` and the idle estimate are a before/after pair: both must
    measure the branch that was compacted, even when another branch became the latest leaf
    while the summarizer worked."""
    gate = Gate()
    s = Session(store).on_compaction(create_compact_function(gate, tail_token_budget=60))
    await append_all(s, long_conversation(12))
    seq = await last_seq(s)
    task = asyncio.create_task(s.compact())
    await gate.entered.wait()
    await s.append_message(text_message("b1", "user", "a new branch"), "c6")
    gate.release.set()
    await task

    events = await status_events(s, seq)
    assert [d["phase"] for _, d in events] == ["compacting", "idle"]
    compacting, idle = events[0][1], events[1][1]
    assert idle["compacted"]["tokens_before"] == compacting["token_estimate"]
    assert idle["token_estimate"] == await s.estimate_tokens("c12")


# == tool-call boundaries ====================================================================


def call_part(shape: str) -> dict[str, Any]:
    if shape == "typed":
        return {
            "type": "tool-lookup",
            "toolCallId": "k1",
            "toolName": "lookup",
            "state": "input-available",
            "input": {"q": "x"},
        }
    if shape == "dynamic":
        return {
            "type": "dynamic-tool",
            "toolCallId": "k1",
            "toolName": "lookup",
            "state": "input-available",
            "input": {"q": "x"},
        }
    return {
        "type": "tool-invocation",
        "toolInvocation": {"state": "call", "toolCallId": "k1", "toolName": "lookup", "args": {"q": "x"}},
    }


def result_part(shape: str) -> dict[str, Any]:
    if shape == "typed":
        return {
            "type": "tool-lookup",
            "toolCallId": "k1",
            "toolName": "lookup",
            "state": "output-available",
            "input": {"q": "x"},
            "output": "found it",
        }
    if shape == "dynamic":
        return {
            "type": "dynamic-tool",
            "toolCallId": "k1",
            "toolName": "lookup",
            "state": "output-available",
            "input": {"q": "x"},
            "output": "found it",
        }
    return {
        "type": "tool-invocation",
        "toolInvocation": {
            "state": "result",
            "toolCallId": "k1",
            "toolName": "lookup",
            "args": {"q": "x"},
            "result": "found it",
        },
    }


SHAPES = ["typed", "dynamic", "legacy"]
RESULT_ROLES = ["assistant", "user"]


@pytest.mark.parametrize("boundary", ["head", "tail"])
@pytest.mark.parametrize("result_role", RESULT_ROLES)
@pytest.mark.parametrize("shape", SHAPES)
async def test_tool_call_and_result_are_never_split(shape: str, result_role: str, boundary: str) -> None:
    """A call in an assistant message and its result in the next message sit right on the
    head boundary (protect_head=3: call c3, result c4) or the tail boundary (budget 1,
    min tail 2: call c10, result c11). The compacted span holds both or neither."""
    messages = long_conversation(12)
    call_index = 2 if boundary == "head" else 9
    messages[call_index] = {"id": f"c{call_index + 1}", "role": "assistant", "parts": [call_part(shape)]}
    messages[call_index + 1] = {
        "id": f"c{call_index + 2}",
        "role": result_role,
        "parts": [result_part(shape)],
    }
    fn = create_compact_function(stub_summarize, tail_token_budget=60 if boundary == "head" else 1)
    result = CompactResult.coerce(await fn(as_messages(messages), CompactContext()))
    assert result is not None
    order = [m["id"] for m in messages]
    start, end = order.index(result.from_message_id), order.index(result.to_message_id)

    def inside(i: int) -> bool:
        return start <= i <= end

    assert inside(call_index) == inside(call_index + 1), (
        f"span {result.from_message_id}..{result.to_message_id} separates call "
        f"{order[call_index]} from result {order[call_index + 1]}"
    )


# == truncate_older_messages / truncate_tool_output (utils/compaction.test.ts) ===============


def tool_message(message_id: str, output: Any) -> dict[str, Any]:
    return {
        "id": message_id,
        "role": "assistant",
        "parts": [
            {
                "type": "tool-read",
                "toolCallId": f"tc-{message_id}",
                "toolName": "read",
                "state": "output-available",
                "input": {"path": "/large.txt"},
                "output": output,
            }
        ],
    }


def first_output(message: Message) -> Any:
    return message.parts[0]["output"]


def test_truncate_older_object_outputs_keep_their_shape() -> None:
    large = "x" * 1000
    messages = as_messages(
        [
            tool_message("old-tool", {"path": "/large.txt", "content": large, "totalLines": 1}),
            text_message("old-user", "user", "next"),
            text_message("recent-1", "user", "recent one"),
            text_message("recent-2", "user", "recent two"),
        ]
    )
    out = truncate_older_messages(messages, keep_recent=2, max_tool_output_chars=100)
    output = first_output(out[0])
    assert isinstance(output, dict)
    assert output["path"] == "/large.txt" and output["totalLines"] == 1
    assert "[truncated" in output["content"] and len(output["content"]) < len(large)
    # As the original computes it: the content first cut to the per-field budget (80), then
    # shrunk to a quarter of the budget, reporting the length it had then.
    assert output == {"path": "/large.txt", "content": "x... [truncated 80 chars]", "totalLines": 1}
    assert len(js_json(output)) <= 100
    # The input is untouched; unchanged older messages are the same objects.
    assert first_output(messages[0])["content"] == large
    assert out[1] is messages[1]


def test_truncate_nested_arrays_with_small_budgets_keep_markers() -> None:
    value = {k: list(range(1000)) for k in "abcdefg"}
    messages = as_messages(
        [
            tool_message("old-tool", value),
            text_message("recent-1", "user", "recent one"),
            text_message("recent-2", "user", "recent two"),
        ]
    )
    out = truncate_older_messages(messages, keep_recent=2, max_tool_output_chars=500)
    output = first_output(out[0])
    assert len(output["a"]) == 1
    assert output["a"][0] != ""
    assert output["a"][0]["__truncated"] is True
    assert isinstance(output["a"][0]["__truncatedChars"], int)
    # Each array no longer fits its 80-char share: a one-element structured marker naming
    # the array's own JSON length (3891 chars for 0..999).
    assert len(js_json(list(range(1000)))) == 3891
    assert output == {k: [{"__truncated": True, "__truncatedChars": 3891}] for k in "abcdefg"}


def test_truncate_array_keeps_what_fits_and_says_so() -> None:
    value = [c * 70 for c in "abcde"]
    output, truncated = truncate_tool_output(value, 200)
    assert truncated is True
    assert output == ["a" * 70, "b" * 70, "Array output truncated ... [truncated 366 chars]"]
    assert len(js_json(output)) <= 200


def test_truncate_stops_at_the_depth_limit() -> None:
    value: Any = {"k": "x" * 2000}
    for _ in range(9):
        value = {"k": value}
    output, truncated = truncate_tool_output(value, 1000)
    assert truncated is True
    expected: Any = "[Nested output omitted ... [truncated 2014 chars]]"
    for _ in range(8):
        expected = {"k": expected}
    assert output == expected


def test_truncate_leaves_recent_tool_outputs_intact() -> None:
    recent = {"path": "/recent.txt", "content": "y" * 1000, "totalLines": 1}
    messages = as_messages(
        [
            text_message("old-1", "user", "old"),
            text_message("old-2", "user", "old"),
            tool_message("recent-tool", recent),
        ]
    )
    out = truncate_older_messages(messages, keep_recent=2, max_tool_output_chars=100)
    assert first_output(out[2]) is recent
    assert out[2] is messages[2]


def test_truncate_keeps_string_outputs_strings() -> None:
    messages = as_messages(
        [
            tool_message("old-tool", "z" * 1000),
            text_message("recent-1", "user", "recent one"),
            text_message("recent-2", "user", "recent two"),
        ]
    )
    out = truncate_older_messages(messages, keep_recent=2, max_tool_output_chars=100)
    output = first_output(out[0])
    assert isinstance(output, str)
    assert "[truncated" in output
    assert output == "z" * 74 + "... [truncated 1000 chars]"


def test_truncate_tool_output_returns_fitting_output_as_is() -> None:
    value = {"a": [1, 2, 3]}
    output, truncated = truncate_tool_output(value, 500)
    assert output is value and truncated is False


def test_truncate_older_messages_short_list_is_unchanged() -> None:
    messages = as_messages([tool_message("t", "z" * 1000)])
    out = truncate_older_messages(messages, keep_recent=4, max_tool_output_chars=10)
    assert out == messages and out[0] is messages[0]


def test_truncate_older_long_texts() -> None:
    messages = as_messages([text_message("o", "user", "é" * 30), text_message("r", "user", "recent")])
    out = truncate_older_messages(messages, keep_recent=1, max_text_chars=10)
    assert out[0].parts == [{"type": "text", "text": "é" * 10 + "... [truncated 30 chars]"}]
    assert messages[0].parts[0]["text"] == "é" * 30


# == sanitize_tool_pairs ======================================================================


def test_sanitize_removes_orphaned_results() -> None:
    messages = as_messages(
        [
            {
                "id": "u1",
                "role": "user",
                "parts": [
                    {"type": "text", "text": "keep me"},
                    {"type": "tool-x", "toolCallId": "gone", "toolName": "x", "output": "orphan"},
                ],
            },
            {
                "id": "u2",
                "role": "user",
                "parts": [{"type": "dynamic-tool", "toolCallId": "gone2", "toolName": "y", "output": 1}],
            },
            text_message("u3", "user", "hi"),
        ]
    )
    out = sanitize_tool_pairs(messages)
    assert ids(out) == ["u1", "u3"]  # u2 lost its only part and is dropped
    assert out[0].parts == [{"type": "text", "text": "keep me"}]
    assert out[1] is messages[2]
    assert len(messages[0].parts) == 2  # the input is not modified


def test_sanitize_stubs_missing_results() -> None:
    messages = as_messages(
        [
            {
                "id": "a1",
                "role": "assistant",
                "parts": [
                    {"type": "tool-x", "toolCallId": "k1", "toolName": "x", "state": "input-available"},
                    {"type": "tool-y", "toolCallId": "k2", "state": "input-available"},
                ],
            },
            text_message("u1", "user", "next"),
        ]
    )
    out = sanitize_tool_pairs(messages)
    assert ids(out) == ["a1", "stub-k1", "stub-k2", "u1"]
    assert out[1].role == "assistant"
    assert out[1].parts == [
        {"type": "tool-result", "toolCallId": "k1", "toolName": "x", "result": STUB_RESULT}
    ]
    assert out[2].parts[0]["toolName"] == "unknown"
    assert out[1].created_at is not None
    assert STUB_RESULT == "[Result from earlier conversation — see context summary above]"


def test_sanitize_keeps_complete_pairs() -> None:
    messages = as_messages(
        [
            {"id": "a1", "role": "assistant", "parts": [call_part("typed")]},
            {"id": "u1", "role": "user", "parts": [result_part("typed")]},
        ]
    )
    out = sanitize_tool_pairs(messages)
    assert out == messages
    assert all(a is b for a, b in zip(out, messages, strict=True))


# -- status after edits, deletes and clears (the original's idle frames) ----------------------


async def test_status_after_update_delete_and_clear_through_the_manager(store: SqliteStore) -> None:
    manager = SessionManager(store).compact_after(1000)
    sid = (await manager.create("fill")).id
    await manager.append(sid, text_message("m0", "user", "one two three four"))
    await manager.append(sid, text_message("m1", "assistant", "five six"))
    s = manager.get_session(sid)
    seq = await last_seq(s)
    await s.update_message(text_message("m1", "assistant", "five six seven eight nine ten eleven"))
    after_update = await s.estimate_tokens()
    await manager.delete_messages(sid, ["m1"])
    after_delete = await s.estimate_tokens()
    await manager.clear_messages(sid)
    statuses = await status_events(s, seq)
    assert statuses == [
        ("status", {"phase": "idle", "token_estimate": after_update, "token_threshold": 1000}),
        ("status", {"phase": "idle", "token_estimate": after_delete, "token_threshold": 1000}),
        ("status", {"phase": "idle", "token_estimate": 0, "token_threshold": 1000}),
    ]
    assert after_update > after_delete > 0
    # Without a threshold there is no fill level to report.
    plain = Session(store).for_session("plain")
    await plain.append_message(text_message("p0", "user", "hi"))
    await plain.update_message(text_message("p0", "user", "hello"))
    await plain.delete_messages(["p0"])
    await plain.clear_messages()
    assert await status_events(plain) == []


async def test_compaction_without_context_logs_no_prompt_update(store: SqliteStore) -> None:
    s = Session(store).on_compaction(Recorder(CompactResult("m0", "m2", "the summary")))
    await append_all(s, numbered(6))
    assert await s.compact() is not None
    types = [e.type for e in await s.read_events()]
    assert "compaction.added" in types
    assert "prompt.updated" not in types  # no context and no prompt: nothing changed


async def test_compaction_logs_a_prompt_that_changed(store: SqliteStore) -> None:
    s = (
        Session(store)
        .for_session("changed")
        .with_context("memory")
        .on_compaction(Recorder(CompactResult("m0", "m2", "the summary")))
    )
    await append_all(s, numbered(6))
    frozen = await s.freeze_system_prompt()
    await s.replace_context_block("memory", "User likes tea.")
    assert await s.freeze_system_prompt() == frozen  # a block write keeps the frozen prompt
    seq = await last_seq(s)
    assert await s.compact() is not None
    refreshed = [e.data for e in await s.read_events(seq) if e.type == "prompt.updated"]
    assert len(refreshed) == 1 and "User likes tea." in refreshed[0]["prompt"]
    assert refreshed[0]["prompt"] == await s.freeze_system_prompt() != frozen
