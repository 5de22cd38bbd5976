"""The built-in responder: answers the hub's turns by streaming from an OpenAI-compatible
``/v1/chat/completions`` server (``stream: true``), as ``sessionhub respond`` runs it.

For each turn it sends the session's frozen system prompt and the branch up to the turn
(its images as ``image_url`` parts, read from the hub's ``/files``: docs/files.md);
with context blocks, the session's context tools too. The model's text and reasoning
stream into the reply as they come; its tool calls run in the hub (``run_tool``, through
``dispatch``) and show up live as tool parts (``input-available``, then
``output-available``), and the model is called again with the results, up to
``max_tool_rounds`` times. Token usage is added to the session. Retries and errors are those
of :class:`hub.completions.ChatCompletions`, the client the summarizer uses too: timeouts,
connection errors and 408/409/425/429/5xx answers are retried with backoff — until the
first token has streamed, after which a failure ends the reply — and what cannot be
retried fails the turn with the server's answer in the chat's ``error`` chunk.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx2

from clients import HubClient, MessageStream, RemoteTool, Turn
from protocol import Message
from protocol.errors import SummarizerError

from ..completions import ChatCompletions
from ..store.attachments import FILE_PATH

__all__ = ["ChatCompletionsResponder", "chat_messages", "fetch_images", "image_refs", "run_responder"]

log = logging.getLogger("sessionhub.responder")


#: An image larger than this is not sent to the model (vision APIs refuse bigger ones).
MAX_IMAGE_BYTES = 20 << 20


def image_refs(history: Sequence[Message]) -> list[str]:
    """The hub file URLs of the images in the branch's user messages, each once."""
    found: dict[str, None] = {}
    for message in history:
        if message.role == "assistant":
            continue
        for part in message.parts:
            url = part.get("url")
            media = str(part.get("mediaType", ""))
            is_image = part.get("type") == "file" and media.startswith("image/")
            if is_image and isinstance(url, str) and url.startswith(FILE_PATH):
                found[url] = None
    return list(found)


async def fetch_images(hub_url: str, token: str | None, refs: Sequence[str]) -> dict[str, str]:
    """Each image of ``refs`` as a ``data:`` URL, read from the hub's ``GET /files`` with the
    responder's token (a model server cannot reach the hub's files); one that cannot be
    read, or is too big, is left out (the model gets the rest of the message)."""
    if not refs:
        return {}
    parts = urlsplit(hub_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    base = urlunsplit((scheme, parts.netloc, "", "", ""))
    headers = {} if token is None else {"authorization": f"Bearer {token}"}
    out: dict[str, str] = {}
    async with httpx2.AsyncClient(timeout=30) as http:
        for ref in refs:
            try:
                async with http.stream("GET", base + ref, headers=headers) as r:
                    if r.status_code != 200 or int(r.headers.get("content-length", 0)) > MAX_IMAGE_BYTES:
                        log.warning("image %s not sent to the model (HTTP %d)", ref, r.status_code)
                        continue
                    data = await r.aread()
                    media = r.headers.get("content-type", "image/png")
            except httpx2.HTTPError as exc:
                log.warning("image %s not sent to the model: %s", ref, exc)
                continue
            out[ref] = f"data:{media};base64," + base64.b64encode(data).decode()
    return out


def _user_content(message: Message, text: str, images: Mapping[str, str]) -> str | list[dict[str, Any]]:
    """A user message's content: its text, or, with images, the API's list of parts."""
    urls = [images[p["url"]] for p in message.parts if p.get("type") == "file" and p.get("url") in images]
    if not urls:
        return text
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return content


def chat_messages(
    history: Sequence[Message], system: str | None = None, images: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """A branch as chat-completions messages: text, images (``images``: a file part's hub URL
    -> the ``data:`` URL the model gets, see :func:`fetch_images`), and tool calls with
    their results."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in history:
        text = "".join(str(p.get("text", "")) for p in message.parts if p.get("type") == "text")
        if message.role != "assistant":
            role = message.role if message.role in ("system", "user") else "user"
            out.append({"role": role, "content": _user_content(message, text, images or {})})
            continue
        calls, results = [], []
        for part in message.parts:
            kind = str(part.get("type", ""))
            if not (kind.startswith("tool-") or kind == "dynamic-tool"):
                continue
            if part.get("state") not in ("output-available", "output-error"):
                continue
            name = str(part.get("toolName", "")) if kind == "dynamic-tool" else kind[len("tool-") :]
            call_id = str(part.get("toolCallId", ""))
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(part.get("input") or {})},
                }
            )
            output = part.get("output") if part.get("state") == "output-available" else part.get("errorText")
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": output if isinstance(output, str) else json.dumps(output),
                }
            )
        entry: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            entry["tool_calls"] = calls
        out.append(entry)
        out.extend(results)
    return out


@dataclass
class _Call:
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class _Round:
    """What one streamed completion produced."""

    calls: dict[int, _Call] = field(default_factory=dict)
    text: str = ""
    input_tokens: int = 0
    output_tokens: int = 0

    def clear(self) -> None:
        """Forget a failed attempt's part (before anything of it was streamed)."""
        self.calls.clear()
        self.text = ""
        self.input_tokens = self.output_tokens = 0


class ChatCompletionsResponder:
    """Answers turns with a chat-completions model (see the module)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        temperature: float | None = None,
        max_tokens: int | None = None,
        max_tool_rounds: int = 8,
        client: httpx2.AsyncClient | None = None,
    ) -> None:
        self.api = ChatCompletions(
            base_url,
            model,
            api_key,
            timeout=timeout,
            max_retries=max_retries,
            backoff=backoff,
            client=client,
            name="model server",  # failures read "model server request to URL failed: ..."
        )
        self.url = self.api.url
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_tool_rounds = max_tool_rounds
        #: The hub it answers (run_responder sets it): where the turns' images are read.
        self.hub: HubClient | None = None

    async def answer(self, turn: Turn) -> None:
        """Stream the turn's reply; a failure aborts it with the reason shown in the chat."""
        session = turn.session
        system = await session.freeze_system_prompt()
        tools = await session.tools()
        refs = image_refs(turn.history)
        hub = self.hub
        images = await fetch_images(hub.url, hub.token, refs) if refs and hub is not None else {}
        messages = chat_messages(turn.history, system, images)
        used = [0, 0]
        try:
            await self._answer(turn, tools, messages, used)
        except Exception:
            # A reply that failed before saying anything is not left as an empty message.
            with contextlib.suppress(Exception):
                reply = await session.get_message(turn.reply_id)
                if reply is not None and not reply.parts:
                    await turn.client.sessions.delete_messages(turn.session_id, [turn.reply_id])
            raise

    async def _answer(
        self,
        turn: Turn,
        tools: list[RemoteTool],
        messages: list[dict[str, Any]],
        used: list[int],
    ) -> None:
        async with self.api.connection() as client, turn.reply() as st:
            try:
                for _ in range(self.max_tool_rounds + 1):
                    result = await self._round(client, messages, tools, st)
                    used[0] += result.input_tokens
                    used[1] += result.output_tokens
                    if not result.calls:
                        break
                    messages += await self._run_tools(result, tools, st)
            finally:
                # Before the reply ends: whoever sees it finished sees its usage too.
                if used[0] or used[1]:
                    with contextlib.suppress(Exception):
                        await turn.client.sessions.add_usage(turn.session_id, used[0], used[1], 0.0)

    def _body(self, messages: list[dict[str, Any]], tools: Sequence[RemoteTool]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
                }
                for t in tools
            ]
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return body

    async def _round(
        self,
        client: httpx2.AsyncClient,
        messages: list[dict[str, Any]],
        tools: Sequence[RemoteTool],
        st: MessageStream,
    ) -> _Round:
        result = _Round()
        await self.api.stream(
            client,
            self._body(messages, tools),
            lambda chunk: self._apply(chunk, result, st),
            on_retry=result.clear,
        )
        return result

    async def _apply(self, chunk: dict[str, Any], result: _Round, st: MessageStream) -> bool:
        """One streamed chunk into the reply; True if it carried content."""
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            result.input_tokens += int(usage.get("prompt_tokens") or 0)
            result.output_tokens += int(usage.get("completion_tokens") or 0)
        content = False
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(thought, str) and thought:
                await st.reasoning(thought)
                content = True
            text = delta.get("content")
            if isinstance(text, str) and text:
                await st.text(text)
                result.text += text
                content = True
            for call in delta.get("tool_calls") or []:
                held = result.calls.setdefault(int(call.get("index", 0)), _Call())
                held.id = call.get("id") or held.id
                function = call.get("function") or {}
                held.name = function.get("name") or held.name
                held.arguments += function.get("arguments") or ""
                content = True
        return content

    async def _run_tools(
        self, result: _Round, tools: Sequence[RemoteTool], st: MessageStream
    ) -> list[dict[str, Any]]:
        """Run the round's tool calls in the hub, each shown live as a tool part."""
        by_name = {t.name: t for t in tools}
        calls = [result.calls[i] for i in sorted(result.calls)]
        asked: dict[str, Any] = {"role": "assistant", "content": result.text or None, "tool_calls": []}
        answers: list[dict[str, Any]] = []
        for n, call in enumerate(calls):
            call_id = call.id or f"call-{n}"
            try:
                arguments: Any = json.loads(call.arguments or "{}")
            except ValueError:
                arguments = call.arguments
            part: dict[str, Any] = {"type": f"tool-{call.name}", "toolCallId": call_id, "input": arguments}
            await st.tool_part({**part, "state": "input-available"})
            tool = by_name.get(call.name)
            if tool is None:
                output = f"Error: no tool named {call.name!r}"
            else:
                output = await tool.execute(call.arguments or "{}")
            await st.tool_part({**part, "state": "output-available", "output": output})
            asked["tool_calls"].append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            )
            answers.append({"role": "tool", "tool_call_id": call_id, "content": output})
        return [asked, *answers]


async def run_responder(
    url: str | Sequence[str],
    responder: ChatCompletionsResponder,
    *,
    token: str | None = None,
    name: str = "responder",
    concurrency: int = 64,
    ready: asyncio.Event | None = None,
) -> None:
    """Answer the hub's turns until cancelled, up to ``concurrency`` at once."""
    slots = asyncio.Semaphore(concurrency)
    running: set[asyncio.Task[None]] = set()

    async def one(turn: Turn) -> None:
        try:
            await responder.answer(turn)
        except SummarizerError as exc:
            log.warning("turn %s in %s failed: %s", turn.turn_id, turn.session_id, exc)
        except Exception:
            log.exception("turn %s in %s failed", turn.turn_id, turn.session_id)
        finally:
            slots.release()

    async with HubClient(url, token=token, name=name, role="worker") as hub:
        responder.hub = hub
        turns = hub.turns()
        try:
            first = asyncio.ensure_future(anext(turns))
            if ready is not None:
                ready.set()
            turn = await first
            while True:
                await slots.acquire()
                task = asyncio.create_task(one(turn))
                running.add(task)
                task.add_done_callback(running.discard)
                turn = await anext(turns)
        except StopAsyncIteration:
            pass
        finally:
            for task in list(running):
                task.cancel()
            await turns.aclose()
