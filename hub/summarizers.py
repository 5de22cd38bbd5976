"""Summarizers: turn a summary prompt into a summary.

A summarizer is any callable ``(prompt: str) -> str`` (sync or async); see
:class:`hub.compaction.Summarizer`. :class:`OpenAICompatible` talks to any server that
speaks OpenAI's ``/v1/chat/completions`` (OpenAI, vLLM, llama.cpp, Ollama, LiteLLM...).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx2

from protocol.errors import SummarizerError

from .compaction import Summarizer

__all__ = ["OpenAICompatible", "Summarizer"]

_RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class OpenAICompatible:
    """Summarize with a chat-completions model.

    ``base_url`` is the API root (``https://api.openai.com/v1`` or
    ``http://localhost:8000/v1``); ``/chat/completions`` is appended. Transient failures
    (timeouts, connection errors, 408/409/425/429/5xx) are retried ``max_retries`` times
    with exponential backoff and jitter, honouring ``Retry-After``; anything else, or
    running out of retries, raises :class:`~protocol.errors.SummarizerError` with the
    server's answer in the message.
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
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.system_prompt = system_prompt
        self.temperature = temperature
        self.max_tokens = max_tokens
        self._client = client

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

    def _delay(self, attempt: int, response: httpx2.Response | None) -> float:
        if response is not None:
            retry_after = response.headers.get("retry-after")
            if retry_after is not None:
                try:
                    return min(max(float(retry_after), 0.0), 60.0)
                except ValueError:
                    pass
        return float(self.backoff * (2**attempt) * (0.5 + random.random()))

    async def __call__(self, prompt: str) -> str:
        headers = {"content-type": "application/json"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        client = self._client or httpx2.AsyncClient(timeout=self.timeout)
        try:
            return await self._post(client, headers, self._body(prompt))
        finally:
            if self._client is None:
                await client.aclose()

    async def _post(self, client: httpx2.AsyncClient, headers: dict[str, str], body: dict[str, Any]) -> str:
        last = "no attempt made"
        for attempt in range(self.max_retries + 1):
            response: httpx2.Response | None = None
            try:
                response = await client.post(self.url, json=body, headers=headers, timeout=self.timeout)
            except httpx2.TimeoutException:
                last = f"timed out after {self.timeout}s"
            except httpx2.TransportError as exc:
                last = f"connection failed: {exc}"
            else:
                if response.status_code == 200:
                    return _summary_of(response)
                last = f"HTTP {response.status_code}: {response.text[:500]}"
                if response.status_code not in _RETRY_STATUS:
                    raise SummarizerError(f"summarizer request to {self.url} failed: {last}")
            if attempt < self.max_retries:
                await asyncio.sleep(self._delay(attempt, response))
        raise SummarizerError(
            f"summarizer request to {self.url} failed after {self.max_retries + 1} attempts: {last}"
        )


def _summary_of(response: httpx2.Response) -> str:
    try:
        data = response.json()
        content = data["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise SummarizerError(f"summarizer answer is not a chat completion: {response.text[:500]}") from None
    if not isinstance(content, str):
        raise SummarizerError("summarizer answer has no text content")
    return content
