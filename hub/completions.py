"""One client of an OpenAI-compatible ``/v1/chat/completions`` server (OpenAI, vLLM,
llama.cpp, Ollama, LiteLLM...), shared by the summarizer
(:class:`hub.summarizers.OpenAICompatible`, one answer a prompt) and the built-in responder
(:mod:`hub.apps.responder`, streamed answers).

What they share is what talking to such a server takes: the URL and headers, the retry
policy (timeouts, connection errors and 408/409/425/429/5xx answers are retried
``max_retries`` times with exponential backoff and jitter, honouring ``Retry-After``; a
stream only until its first content has gone out, since a retry would say it twice), and
the errors: anything that cannot be retried, or running out of retries, raises
:class:`~protocol.errors.SummarizerError` with the server's answer in the message. What
each sends and makes of the answer stays with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx2

from protocol.errors import SummarizerError

__all__ = ["RETRY_STATUS", "ChatCompletions"]

#: The answers worth asking again: the server was busy, slow or briefly broken.
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class ChatCompletions:
    """The endpoint at ``base_url`` (the API root, ``https://api.openai.com/v1`` or
    ``http://localhost:8000/v1``; ``/chat/completions`` is appended), asked for ``model``.

    ``name`` says who asks, in error messages (``summarizer request to ... failed``).
    ``client`` is an ``httpx2.AsyncClient`` to reuse; without one, each :meth:`connection`
    opens its own and closes it after.
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
        client: httpx2.AsyncClient | None = None,
        name: str = "summarizer",
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.name = name
        self._client = client

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[httpx2.AsyncClient]:
        """The client to send with: the one given, or a new one closed at the end."""
        if self._client is not None:
            yield self._client
            return
        client = httpx2.AsyncClient(timeout=self.timeout)
        try:
            yield client
        finally:
            await client.aclose()

    def headers(self, *, stream: bool = False) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if stream:
            headers["accept"] = "text/event-stream"
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        return headers

    def delay(self, attempt: int, response: httpx2.Response | None) -> float:
        """How long to wait before retry ``attempt + 1``: the server's ``Retry-After`` (at
        most a minute), else exponential backoff with jitter."""
        if response is not None:
            retry_after = response.headers.get("retry-after")
            if retry_after is not None:
                try:
                    return min(max(float(retry_after), 0.0), 60.0)
                except ValueError:
                    pass
        return float(self.backoff * (2**attempt) * (0.5 + random.random()))

    async def complete(self, client: httpx2.AsyncClient, body: dict[str, Any]) -> httpx2.Response:
        """POST ``body`` (not streamed) until a 200 answer, which is returned."""
        last = "no attempt made"
        for attempt in range(self.max_retries + 1):
            response: httpx2.Response | None = None
            try:
                response = await client.post(
                    self.url, json=body, headers=self.headers(), timeout=self.timeout
                )
            except httpx2.TimeoutException:
                last = self._timed_out()
            except httpx2.TransportError as exc:
                last = f"connection failed: {exc}"
            else:
                if response.status_code == 200:
                    return response
                last = f"HTTP {response.status_code}: {response.text[:500]}"
                self._refuse_unless_retryable(response.status_code, last)
            await self._before_retry(attempt, response)
        raise self._out_of_attempts(last)

    async def stream(
        self,
        client: httpx2.AsyncClient,
        body: dict[str, Any],
        on_chunk: Callable[[dict[str, Any]], Awaitable[bool]],
        *,
        on_retry: Callable[[], None] | None = None,
    ) -> None:
        """POST ``body`` (with ``"stream": true``) and hand each server-sent chunk to
        ``on_chunk``, which says whether it carried content. Retried until content has gone
        out; after that a break ends the stream with :class:`SummarizerError`.
        ``on_retry`` forgets what the failed attempt gathered."""
        last = "no attempt made"
        for attempt in range(self.max_retries + 1):
            if attempt and on_retry is not None:
                on_retry()
            streamed = False
            response: httpx2.Response | None = None
            try:
                async with client.stream(
                    "POST", self.url, json=body, headers=self.headers(stream=True), timeout=self.timeout
                ) as response:
                    if response.status_code == 200:
                        async for chunk in _events(response):
                            streamed = await on_chunk(chunk) or streamed
                        return
                    text = (await response.aread()).decode(errors="replace")
                    last = f"HTTP {response.status_code}: {text[:500]}"
                    self._refuse_unless_retryable(response.status_code, last)
            except httpx2.TimeoutException:
                last = self._timed_out()
            except httpx2.TransportError as exc:
                last = f"connection failed: {exc}"
            if streamed:
                # Part of the answer is out: a retry would say it twice.
                raise SummarizerError(f"{self.name} stream from {self.url} broke off: {last}")
            await self._before_retry(attempt, response)
        raise self._out_of_attempts(last)

    def _timed_out(self) -> str:
        return f"timed out after {self.timeout:g}s"

    def _refuse_unless_retryable(self, status: int, last: str) -> None:
        if status not in RETRY_STATUS:
            raise SummarizerError(f"{self.name} request to {self.url} failed: {last}")

    async def _before_retry(self, attempt: int, response: httpx2.Response | None) -> None:
        if attempt < self.max_retries:
            await asyncio.sleep(self.delay(attempt, response))

    def _out_of_attempts(self, last: str) -> SummarizerError:
        return SummarizerError(
            f"{self.name} request to {self.url} failed after {self.max_retries + 1} attempts: {last}"
        )


async def _events(response: httpx2.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON chunks of a server-sent event stream, up to ``[DONE]``; an error the
    stream reports, or a line that is not JSON, is :class:`SummarizerError`."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            raise SummarizerError(f"the model's stream sent a line that is not JSON: {data[:200]}") from None
        if isinstance(chunk, dict):
            if isinstance(chunk.get("error"), dict | str):
                raise SummarizerError(f"the model's stream reported an error: {str(chunk['error'])[:500]}")
            yield chunk
