"""Built-in context providers.

Providers are duck-typed (as in the original): ``get()`` makes a read-only block; adding
``set(content)`` makes it writable; ``load(key)`` makes it a skill collection; ``search(query)``
makes it searchable; ``init(label)`` is optional. Methods may be sync or async.
The file-backed skill provider lives in :mod:`hub.skills`.
"""

from __future__ import annotations

from .store.base import LogEntry, Store

__all__ = ["FileText", "ReadonlyText", "StoreContextProvider", "StoreSearchProvider"]


class ReadonlyText:
    """A fixed text: a persona, house rules, anything the model must not edit."""

    def __init__(self, text: str | None) -> None:
        self.text = text

    def get(self) -> str | None:
        return self.text


class FileText:
    """A read-only block kept in a file, read at each load of the blocks (so an edit shows
    at the next ``refresh_system_prompt``). A missing file is an empty block."""

    def __init__(self, path: str) -> None:
        self.path = path

    def get(self) -> str | None:
        try:
            with open(self.path, encoding="utf-8") as file:
                return file.read()
        except FileNotFoundError:
            return None


class StoreContextProvider:
    """A writable block stored as one row of the store, keyed by ``label``.

    ``init(label)`` sets the key only when none was given, so namespaced keys such as
    ``memory_<session id>`` survive. With ``session_id`` the write and its event in that
    session's log are one transaction.
    """

    def __init__(
        self,
        store: Store,
        label: str | None = None,
        *,
        session_id: str | None = None,
        event_type: str = "context.updated",
    ) -> None:
        self.store = store
        self.key = label
        self.label = label
        self.session_id = session_id
        self.event_type = event_type

    @property
    def emits_events(self) -> bool:
        """Whether ``set`` logs its own event (the caller must not log another)."""
        return self.session_id is not None

    def init(self, label: str) -> None:
        if self.key is None:
            self.key = label
        self.label = label

    def _key(self) -> str:
        if self.key is None:
            raise RuntimeError("StoreContextProvider has no key: pass a label or call init(label)")
        return self.key

    async def get(self) -> str | None:
        return await self.store.get_context_value(self._key())

    async def set(self, content: str) -> None:
        event = None
        if self.session_id is not None:
            if self.event_type == "prompt.updated":
                data = {"prompt": content}
            else:
                data = {"label": self.label or self._key(), "content": content}
            event = LogEntry(session_id=self.session_id, type=self.event_type, data=data)
        await self.store.set_context_value(self._key(), content, event=event)


class StoreSearchProvider:
    """A searchable block: keyed entries in the store's full-text index.

    Entries are isolated by label (``init(label)`` always sets it); the same key replaces
    an entry, so its old words stop matching. A query matches entries containing every
    word (each word quoted: FTS operators are plain words); at most 10 hits, best first.
    """

    def __init__(self, store: Store, label: str | None = None, *, session_id: str | None = None) -> None:
        self.store = store
        self.label = label
        self.session_id = session_id

    @property
    def emits_events(self) -> bool:
        return self.session_id is not None

    def init(self, label: str) -> None:
        self.label = label

    def _label(self) -> str:
        if self.label is None:
            raise RuntimeError("StoreSearchProvider has no label: pass one or call init(label)")
        return self.label

    async def get(self) -> str | None:
        count = await self.store.count_search_entries(self._label())
        return None if count == 0 else f"{count} entries indexed."

    async def search(self, query: str) -> str | None:
        rows = await self.store.search_entries(self._label(), query, 10)
        if not rows:
            return None
        return "\n\n".join(f"[{key}]\n{content}" for key, content in rows)

    async def set(self, key: str, content: str) -> None:
        label = self._label()
        event = None
        if self.session_id is not None:
            event = LogEntry(
                session_id=self.session_id,
                type="context.entry_set",
                data={"label": label, "key": key, "content": content},
            )
        await self.store.set_search_entry(label, key, content, event=event)
