"""Session.search against the real original's outputs (``search_session.json``).

``golden-exp.mjs::search()`` is replayed against our :class:`hub.Session`: the same corpus
(``SEARCH_CORPUS``), a tool-part-only message and a reasoning + two-text-parts message, then
every query of ``SEARCH_QUERIES``. Each query must give the same hits (id, role, content)
in the same order; where the original raised, we must return [] without raising.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hub import SearchResult, Session, SqliteStore
from tests.support.hubtest import text_message

GOLDEN: dict[str, Any] = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "golden" / "search_session.json").read_text(encoding="utf-8")
)

# golden-common.mjs, verbatim.
SEARCH_CORPUS: list[tuple[str, str, str]] = [
    ("s1", "user", "How do I configure the deployment pipeline?"),
    ("s2", "assistant", "The deployment uses a blue/green rollout with health checks."),
    ("s3", "user", "What about deploying to staging first?"),
    ("s4", "assistant", "Staging deploys run nightly; it deployed fine yesterday."),
    ("s5", "user", 'foo "quoted" bar NEAR(baz) *star* AND OR NOT'),
    ("s7", "user", "Unicode: café naïve résumé 東京 🙂"),
    ("s8", "assistant", "Running runs ran runner"),
]

SEARCH_QUERIES: list[str] = [
    "deployment",
    "deploying",
    "deploy",
    "deploys",
    "deployed",
    "DEPLOYMENT",
    "deployment pipeline",
    "pipeline deployment",
    "configure pipeline",
    "blue green",
    "blue/green",
    "run",
    "running",
    "ran",
    "cafe",
    "café",
    "東京",
    "東",
    '"foo',
    'foo"',
    '"foo"',
    "foo",
    "NEAR(",
    "NEAR(baz)",
    "NEAR",
    "*",
    "star*",
    "sta*",
    "AND",
    "OR",
    "NOT",
    "foo OR bar",
    "foo AND bar",
    "foo NOT bar",
    "-foo",
    "(",
    ")",
    ":",
    "content:foo",
    "role:user",
    "^foo",
    "'",
    "\\",
    "%",
    "_",
    "'; DROP TABLE x; --",
    "🙂",
    "",
    "   ",
    "nonexistentword",
]

S6: dict[str, Any] = {
    "id": "s6",
    "role": "assistant",
    "parts": [
        {
            "type": "tool-search",
            "toolCallId": "c1",
            "state": "output-available",
            "input": {"q": "deployment"},
            "output": "deployment docs",
        }
    ],
}

S9: dict[str, Any] = {
    "id": "s9",
    "role": "assistant",
    "parts": [
        {"type": "reasoning", "text": "deployment reasoning is not indexed"},
        {"type": "text", "text": "First text part."},
        {"type": "text", "text": "Second text part."},
    ],
}


def hits(results: list[SearchResult]) -> list[dict[str, str]]:
    """The fields the original returns: {id, role, content}."""
    return [{"id": r.id, "role": r.role, "content": r.content} for r in results]


async def corpus_session(store: SqliteStore) -> Session:
    s = Session.create(store)
    for mid, role, text in SEARCH_CORPUS:
        await s.append_message(text_message(mid, role, text))
    await s.append_message(S6)
    await s.append_message(S9)
    return s


def test_inputs_match_the_recorder() -> None:
    assert [list(row) for row in SEARCH_CORPUS] == GOLDEN["corpus"]
    assert [json.dumps(q, ensure_ascii=False) for q in SEARCH_QUERIES] == list(GOLDEN["perQuery"])


@pytest.mark.parametrize("query", SEARCH_QUERIES)
async def test_query_matches_golden(store: SqliteStore, query: str) -> None:
    s = await corpus_session(store)
    golden = GOLDEN["perQuery"][json.dumps(query, ensure_ascii=False)]
    ours = hits(await s.search(query))  # must not raise, whatever the query
    if golden["ok"]:
        assert ours == golden["value"]
    else:
        # The original raised; we answer "no results".
        assert ours == []


async def test_tool_part_only_message_is_not_indexed(store: SqliteStore) -> None:
    s = await corpus_session(store)
    # Its tool input/output say "deployment", yet the golden "deployment" hits are s1, s2.
    assert [r.id for r in await s.search("deployment")] == ["s1", "s2"]
    assert await s.search("docs") == []


async def test_reasoning_not_indexed_and_text_parts_joined(store: SqliteStore) -> None:
    s = await corpus_session(store)
    assert await s.search("reasoning") == []
    assert hits(await s.search("Second text part")) == [
        {"id": "s9", "role": "assistant", "content": "First text part. Second text part."}
    ]
    # The join is one space, so the phrase runs across the two parts.
    assert [r.id for r in await s.search("part. Second")] == ["s9"]


async def test_limit_1(store: SqliteStore) -> None:
    s = await corpus_session(store)
    assert hits(await s.search("deployment", limit=1)) == GOLDEN["limit1"]


async def test_after_update(store: SqliteStore) -> None:
    s = await corpus_session(store)
    await s.update_message(text_message("s8", "assistant", "Now about kubernetes"))
    golden = GOLDEN["afterUpdate"]
    assert hits(await s.search("running")) == golden["running"]
    assert hits(await s.search("kubernetes")) == golden["kubernetes"]


async def test_after_delete(store: SqliteStore) -> None:
    s = await corpus_session(store)
    await s.update_message(text_message("s8", "assistant", "Now about kubernetes"))
    await s.delete_messages(["s2"])
    assert hits(await s.search("deployment")) == GOLDEN["afterDelete_s2"]


async def test_other_session_isolated(store: SqliteStore) -> None:
    s = await corpus_session(store)
    await s.update_message(text_message("s8", "assistant", "Now about kubernetes"))
    await s.delete_messages(["s2"])
    other = Session.create(store).for_session("other")
    await other.append_message(text_message("o1", "user", "deployment in another session"))
    golden = GOLDEN["otherSessionIsolated"]
    assert hits(await s.search("another")) == golden["defaultSession"] == []
    other_hits = await other.search("another")
    assert hits(other_hits) == golden["other"]
    assert [r.session_id for r in other_hits] == ["other"]
    # And the default session's "deployment" hits still do not include o1.
    assert hits(await s.search("deployment")) == GOLDEN["afterDelete_s2"]
