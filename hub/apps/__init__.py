"""The entry points: what runs the engine rather than being it.

``cli`` is the ``sessionhub`` command (``serve`` is ``serve``, its compaction options
``serve_compaction``; the other commands' shared option types are ``options``);
``responder`` is ``sessionhub respond``, a client of a hub that answers turns with an
OpenAI-compatible model; ``importers`` reads other frameworks' databases for ``sessionhub
import``; ``backends`` turns ``--db`` and ``--bus`` into a store and a bus. These are the
composition roots: the only hub modules that may import the clients, and none of the engine,
the server or the adapters imports them (pyproject.toml's contracts), with one exception:
``create_app(db=...)`` opens its store through ``backends``.

Importing this package loads nothing: ``sessionhub tail`` need not import the engine.
"""
