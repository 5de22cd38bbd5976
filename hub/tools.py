"""Tools handed to the model, and their OpenAI / Anthropic renderings.

A :class:`Tool` is vendor-neutral: ``name``, ``description``, ``input_schema`` (JSON Schema)
and ``execute(arguments) -> str``. ``execute`` never raises for bad input: a model that sends
wrong arguments gets the error back as the tool result and can correct itself.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

__all__ = ["Tool", "dispatch", "to_anthropic", "to_openai"]


class Tool:
    """One tool: what the model sees and the coroutine that runs it."""

    __slots__ = ("_run", "description", "input_schema", "name")

    def __init__(
        self,
        name: str,
        description: str,
        input_schema: dict[str, Any],
        run: Callable[[dict[str, Any]], Awaitable[str]],
    ) -> None:
        self.name = name
        self.description = description
        self.input_schema = input_schema
        self._run = run

    async def execute(self, arguments: Mapping[str, Any]) -> str:
        """Run the tool. Errors, including malformed arguments, come back as the string."""
        if not isinstance(arguments, Mapping):
            return f"Error: arguments must be a JSON object, got {type(arguments).__name__}"
        problem = _check_arguments(self.input_schema, arguments)
        if problem is not None:
            return f"Error: {problem}"
        try:
            return await self._run(dict(arguments))
        except Exception as exc:  # the model gets the message; the caller's loop goes on
            return f"Error: {exc}"

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"


def _check_arguments(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """The checks a JSON-schema validator would make on our flat schemas (required fields
    and primitive types), with messages a model can act on. Unknown keys are ignored, as
    the original's schemas allow additional properties."""
    properties: Mapping[str, Any] = schema.get("properties", {})
    for name in schema.get("required", []):
        if arguments.get(name) is None:
            return f'missing required argument "{name}"'
    for name, spec in properties.items():
        if name not in arguments or arguments[name] is None:
            continue
        value = arguments[name]
        kind = spec.get("type")
        if kind == "string" and not isinstance(value, str):
            return f'argument "{name}" must be a string'
        if kind == "object" and not isinstance(value, Mapping):
            return f'argument "{name}" must be an object'
    return None


def to_openai(tools: Iterable[Tool]) -> list[dict[str, Any]]:
    """OpenAI Chat Completions ``tools=`` entries (``{"type": "function", ...}``)."""
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.input_schema,
            },
        }
        for t in tools
    ]


def to_anthropic(tools: Iterable[Tool]) -> list[dict[str, Any]]:
    """Anthropic Messages ``tools=`` entries (``{"name", "description", "input_schema"}``)."""
    return [{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in tools]


async def dispatch(tools: Iterable[Tool], name: str, arguments: str | Mapping[str, Any] | None) -> str:
    """Run the tool called ``name``. ``arguments`` may be the raw JSON string a model sent
    (OpenAI's ``function.arguments``) or an already-decoded object (Anthropic's ``input``).
    Never raises: an unknown tool or unreadable arguments give an ``Error: ...`` string."""
    by_name = {t.name: t for t in tools}
    tool = by_name.get(name)
    if tool is None:
        known = ", ".join(by_name) or "none"
        return f'Error: unknown tool "{name}". Available tools: {known}'
    if arguments is None or arguments == "":
        decoded: Any = {}
    elif isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except ValueError as exc:
            return f"Error: arguments are not valid JSON: {exc}"
    else:
        decoded = arguments
    return await tool.execute(decoded)
