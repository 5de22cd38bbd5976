"""The file ``sessionhub init`` writes: every section with its common keys, commented, and
valid as it stands (tests/apps/test_configfile.py checks it with ``config check``)."""

from __future__ import annotations

__all__ = ["STARTER"]

STARTER = """\
# sessionhub.toml: the hub configured in one file (docs/configuration.md lists every key).
#   sessionhub config check sessionhub.toml     # every mistake, one line each
#   sessionhub serve --config sessionhub.toml   # flags given too override this file

# The template a session gets when `create` names none (`sessionhub sessions create NAME
# --template T`, hub.sessions.create(name, template=T) pick another).
default_template = "assistant"

[serve]
# Every `sessionhub serve` option, named as the flag with _ for -.
db = "sessionhub.db"              # a SQLite path, or postgresql://user@host/dbname
host = "127.0.0.1"
port = 8000
# auth_secret = "..."             # turns on tokens; better: $SESSIONHUB_AUTH_SECRET
# allowed_origin = ["https://app.example.com"]
# max_body_bytes = "4M"
# retain_events = "30d"

[compaction]
# Who writes summaries: summarizer = "workers" (connected workers), or an
# OpenAI-compatible server (its key is read from the variable api_key_env names):
# url = "http://127.0.0.1:8080/v1"
# model = "qwen2.5-7b-instruct"
# api_key_env = "SESSIONHUB_SUMMARIZER_API_KEY"
# threshold = 100000              # compact a session once its estimate passes this
# tail_tokens = 20000             # the newest messages kept as they are

[templates.assistant]
description = "A helpful assistant with a memory"
prompt_cache = true               # the frozen prompt survives restarts byte for byte

# Blocks render in this order: each is a [[templates.NAME.blocks]] table.
[[templates.assistant.blocks]]
label = "soul"
text = "You are a helpful assistant."   # read-only (file = "persona.md" reads a file)

[[templates.assistant.blocks]]
label = "memory"
description = "Learned facts"
max_tokens = 1100                 # writable: the model edits it with set_context

[[templates.assistant.blocks]]
label = "knowledge"
description = "Team wiki"
search = true                     # searchable entries in the store (search_context)

# [[templates.assistant.blocks]]
# label = "skills"
# description = "Playbooks"
# skills = "skills/"              # a folder of documents, loaded on demand (load_context)
"""
