"""What ``sessionhub respond`` checks before it answers a turn: a token that can write
(a read-only one would fail every reply), and a model server that answers at all, named
in the one line that says what is wrong."""

from __future__ import annotations

import base64
import json

__all__ = ["model_server_problem", "token_problem"]


def token_problem(token: str | None) -> str | None:
    """Why ``token`` cannot answer turns (read-only), or None (no token, or it may write).
    Read without verifying: only the hub can; this catches the common mistake early."""
    if token is None:
        return None
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        levels = set(dict(claims.get("scopes") or {}).values())
    except (IndexError, ValueError, TypeError, AttributeError):
        return None  # not ours to judge: the hub says
    if levels and levels <= {"read"}:
        return (
            "--token is read-only: respond writes the replies, so it needs write on the sessions "
            "it answers (`sessionhub token --scope write --session '*'`)"
        )
    return None


async def model_server_problem(base_url: str, api_key: str | None, timeout: float = 5.0) -> str | None:
    """Why the model server at ``base_url`` cannot be used, or None. Any HTTP answer but
    401/403 will do: not every server has ``GET /models``."""
    import httpx2

    headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
    try:
        async with httpx2.AsyncClient(timeout=timeout) as http:
            response = await http.get(base_url.rstrip("/") + "/models", headers=headers)
    except httpx2.HTTPError as exc:
        return (
            f"cannot reach the model server at {base_url} ({type(exc).__name__}: {exc or 'no answer'}); "
            "is it running? (--base-url)"
        )
    if response.status_code in (401, 403):
        return (
            f"the model server at {base_url} refused the API key "
            f"({response.status_code}; --api-key or $OPENAI_API_KEY)"
        )
    return None
