"""Query builders: every word quoted, blanks rejected, quotes doubled."""

from __future__ import annotations

import pytest

from hub.store.fts import phrase_query, words_query


def test_phrase_quotes_the_whole_query() -> None:
    assert phrase_query("deployment pipeline") == '"deployment pipeline"'
    assert phrase_query('say "hi"') == '"say ""hi"""'


def test_words_are_each_quoted() -> None:
    assert words_query("friday  deploy") == '"friday" "deploy"'
    assert words_query('a"b OR NEAR(') == '"a""b" "OR" "NEAR("'


@pytest.mark.parametrize("blank", ["", "   ", "\n\t", "\ufeff", "\u3000"])
def test_blank_queries_build_nothing(blank: str) -> None:
    assert phrase_query(blank) is None
    assert words_query(blank) is None
