"""Summarizers: turn a summary prompt into a summary.

A summarizer is any callable ``(prompt: str) -> str`` (sync or async); see
:class:`hub.compaction.Summarizer`. :class:`OpenAICompatible` talks to any server that
speaks OpenAI's ``/v1/chat/completions`` (OpenAI, vLLM, llama.cpp, Ollama, LiteLLM...).
"""

from __future__ import annotations

from typing import Any

import httpx2

from protocol.errors import SummarizerError

from .compaction import Summarizer
from .completions import ChatCompletions

__all__ = ["OpenAICompatible", "Summarizer"]


class OpenAICompatible:
    """Summarize with a chat-completions model.

    ``base_url`` is the API root (``https://api.openai.com/v1`` or
    ``http://localhost:8000/v1``); ``/chat/completions`` is appended. Transient failures
    (timeouts, connection errors, 408/409/425/429/5xx) are retried ``max_retries`` times
    with exponential backoff and jitter, honouring ``Retry-After``; anything else, or
    running out of retries, raises :class:`~protocol.errors.SummarizerError` with the
    server's answer in the message (:class:`hub.completions.ChatCompletions`, the client
    the responder uses too).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        system_prompt: str | None = None,
        temperature: float | None = 0.2,
        max_tokens: int | None = None,
        client: httpx2.AsyncClient | None = None,
    ) -> None:
        self.api = ChatCompletions(
            base_url, model, api_key, timeout=timeout, max_retries=max_retries, backoff=backoff, client=client
        )
        self.url = self.api.url
        self.model = model
        self.system_prompt = system_prompt
        self.temperature = temperature
        self.max_tokens = max_tokens

    def _body(self, prompt: str) -> dict[str, Any]:
        messages = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": prompt})
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return body

    async def __call__(self, prompt: str) -> str:
        async with self.api.connection() as client:
            return _summary_of(await self.api.complete(client, self._body(prompt)))


def _summary_of(response: httpx2.Response) -> str:
    try:
        data = response.json()
        content = data["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise SummarizerError(f"summarizer answer is not a chat completion: {response.text[:500]}") from None
    if not isinstance(content, str):
        raise SummarizerError("summarizer answer has no text content")
    return content
