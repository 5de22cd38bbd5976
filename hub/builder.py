"""What ``Session`` and ``SessionManager`` are configured with, in one typed place.

Both hold a :class:`SessionConfig` and share the builder methods of
:class:`SessionBuilder`; a manager hands each session it builds a copy of its own config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal, Self

from protocol import ContextError

from .compaction import CompactFunction
from .context import ContextConfig

__all__ = ["CompactionErrorHandler", "SessionBuilder", "SessionConfig", "TokenCounter"]

#: ``token_counter({"messages", "system_prompt", "context_blocks"})`` -> a count (or an
#: awaitable of one).
TokenCounter = Callable[[dict[str, Any]], Any]
#: Called (sync or async) with the exception when an automatic compaction fails.
CompactionErrorHandler = Callable[[BaseException], Any]


@dataclasses.dataclass(kw_only=True)
class SessionConfig:
    """The builder state. Providers are duck-typed (any of ``get``, ``set``, ``search``,
    ``load``..., sync or async: see hub/context.py), hence ``object``."""

    #: The context blocks, in order.
    contexts: list[ContextConfig] = dataclasses.field(default_factory=list)
    #: Persist the frozen prompt (in the store, or in ``prompt_provider``).
    cached_prompt: bool = False
    prompt_provider: object | None = None
    compact_fn: CompactFunction | None = None
    #: Auto-compaction after an append once the estimate exceeds it (None: never).
    threshold: float | None = None
    token_counter: TokenCounter | None = None
    compaction_error_handler: CompactionErrorHandler | None = None

    def copy(self, *more_contexts: ContextConfig) -> SessionConfig:
        """A copy with its own list of contexts (``more_contexts`` appended)."""
        return dataclasses.replace(self, contexts=[*self.contexts, *more_contexts])


class SessionBuilder:
    """The builder methods ``Session`` and ``SessionManager`` share. Each returns the
    object and touches nothing; the store is used from the first awaited call."""

    _config: SessionConfig

    def _check_unbuilt(self) -> None:
        """Refuse a change that can no longer apply (a session already in use)."""

    def with_context(
        self,
        label: str,
        *,
        description: str | None = None,
        max_tokens: int | None = None,
        provider: object | None = None,
        when_changed: Literal["wait", "remind"] = "wait",
    ) -> Self:
        """Add a context block. Without a provider the block is a writable row of the store,
        keyed ``<label>_<session id>`` (or ``<label>`` for the default session); on a
        manager, every session gets the block (a provider given here is shared by all).
        ``when_changed="remind"``: a change after the prompt froze reaches the model through
        ``reminder()`` instead of a prompt rewrite (docs/context.md)."""
        self._check_unbuilt()
        if when_changed not in ("wait", "remind"):
            raise ContextError(f"when_changed is 'wait' or 'remind', not {when_changed!r}")
        self._config.contexts.append(ContextConfig(label, description, max_tokens, provider, when_changed))
        return self

    def with_cached_prompt(self, provider: object | None = None) -> Self:
        """Persist the frozen prompt (in the store under ``_system_prompt[_<session id>]``
        unless a provider is given), so it survives restarts byte for byte."""
        self._check_unbuilt()
        self._config.cached_prompt = True
        self._config.prompt_provider = provider
        return self

    def on_compaction(self, fn: CompactFunction) -> Self:
        """The compaction function: ``fn(messages, context) -> CompactResult | None``
        (sync or async), e.g. :func:`hub.compaction.create_compact_function`."""
        self._config.compact_fn = fn
        return self

    def compact_after(self, threshold: float, token_counter: TokenCounter | None = None) -> Self:
        """Compact automatically after an append once the estimate exceeds ``threshold``.
        ``token_counter({"messages", "system_prompt", "context_blocks"})`` replaces the
        heuristic (and sizes the compaction's tail when its function has no counter)."""
        self._config.threshold = threshold
        if token_counter is not None:
            self._config.token_counter = token_counter
        return self

    @property
    def can_compact(self) -> bool:
        """Whether ``compact`` can run: a compaction function was given (``on_compaction``)."""
        return self._config.compact_fn is not None

    def on_compaction_error(self, handler: CompactionErrorHandler) -> Self:
        """Called (sync or async) when an automatic compaction fails; appends never do."""
        self._config.compaction_error_handler = handler
        return self
