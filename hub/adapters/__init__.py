"""The protocol adapters: every protocol the hub speaks beyond its own WebSocket protocol,
one module each (issue 25; another branch moves hub/server/chat_http.py and mcp.py here).

Empty on this branch: it exists so that the engine's contract (pyproject.toml) can forbid
it already. On merge, the adapters branch's ``__init__`` replaces this one.
"""
