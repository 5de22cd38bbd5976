"""Skills kept as files: the original's ``R2SkillProvider`` over a local folder.

A *skill provider* (spec §7.1) is duck-typed: ``get()`` lists what can be loaded, ``load(key)``
returns one document, and ``set(key, content, description)`` makes the block writable.
:class:`FileSkillProvider` keeps one document per file, the key being the file's path relative
to the folder with ``/`` separators, so ``team/deploy`` is ``<folder>/team/deploy``.

Design notes:

* **Descriptions live in sidecars.** R2 stores a description as object metadata; a plain file
  has nowhere to put one without changing the document itself, and a document must load back
  byte for byte. So the description goes beside it in ``.<filename>.description``. The leading
  dot makes it hidden, and hidden names are never keys (the listing skips them and key
  validation refuses them), so a sidecar can never be mistaken for, or overwritten as, a
  document.
* **Writes are atomic.** An agent may ``load`` a skill while another writes it. The new text is
  written to a hidden temporary file in the same folder, fsynced, then moved over the document
  with :func:`os.replace`, which is atomic within one file system: a reader sees the old
  document or the new one, never half of either, and a crash leaves no torn file (at worst a
  hidden ``.tmp`` that the listing ignores).
* **Keys cannot escape the folder.** Keys come from a model's tool call, so they are untrusted.
  Besides refusing ``..``, absolute paths and the like by shape, the resolved path must stay
  inside the resolved folder, which also refuses a symlink that points elsewhere. This guards
  against hostile *keys*; it is not a sandbox against someone who can rearrange the folder
  between the check and the open.
* **The allowlist is checked first.** As in the original (PR #1477), ``keys`` limits what is
  listed and loaded; a key outside it is answered without touching the file system. Writes are
  not restricted by it, also as in the original.
* **Blocking I/O runs in a worker thread** (:func:`asyncio.to_thread`) so a slow disk never
  stalls the event loop that serves every other session.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
from collections.abc import Sequence
from pathlib import Path

from protocol.errors import InvalidInput

__all__ = ["FileSkillProvider"]

_SIDECAR_SUFFIX = ".description"
# A leading "C:" means a drive on Windows; joined onto the folder it would leave it.
_DRIVE = re.compile(r"^[A-Za-z]:")
# os.open defaults to text mode on Windows, which would rewrite line endings.
_O_BINARY: int = getattr(os, "O_BINARY", 0)


def _key_problem(key: object) -> str | None:
    """Why ``key`` is not a valid document key by its shape alone, or None if it is."""
    if not isinstance(key, str):
        return f"must be a str, not {type(key).__name__}"
    if not key:
        return "must not be empty"
    if "\x00" in key:
        return "must not contain NUL"
    if "\\" in key:
        return "must use '/' as separator, not '\\'"
    if key.startswith("/"):
        return "must be relative, not absolute"
    if _DRIVE.match(key):
        return "must not start with a drive letter"
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            return f"must not contain an empty, '.' or '..' segment ({segment!r})"
        if segment.startswith("."):
            # Hidden names are reserved for description sidecars and temporary files.
            return f"must not contain a hidden segment ({segment!r})"
    return None


def _sidecar(path: Path) -> Path:
    return path.with_name(f".{path.name}{_SIDECAR_SUFFIX}")


def _read_text(path: Path) -> str | None:
    """The text of one file, or None if there is no file there.

    Bytes are decoded by hand so line endings come back exactly as written (text mode would
    translate ``\\r\\n``), and with replacement rather than an error, as R2's ``text()`` does.
    """
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    return data.decode("utf-8", errors="replace")


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; directories cannot be opened this way on Windows.
    if os.name == "nt":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that no reader ever sees a partial file."""
    while True:
        # Hidden, so a concurrent listing skips it; created with os.open rather than mkstemp so
        # the final file gets the usual umask-derived mode instead of mkstemp's 0600.
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_BINARY, 0o666)
        except FileExistsError:
            continue
        break
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


class FileSkillProvider:
    """A skill provider over a folder of documents, one document per file.

    ``keys``, when a non-empty sequence, is an allowlist of keys that :meth:`get` lists and
    :meth:`load` serves; ``None`` or an empty sequence exposes every document. The folder need
    not exist: it reads as empty and is created by the first :meth:`set`.
    """

    def __init__(self, directory: str | os.PathLike[str], keys: Sequence[str] | None = None) -> None:
        if isinstance(keys, str):
            # A bare string is a Sequence[str] of its characters: surely a mistake.
            raise InvalidInput("keys must be a sequence of keys, not a single str")
        # Absolute now, so a later chdir cannot move the folder; symlinks are resolved at
        # each use, so the folder itself may be a link that is repointed.
        self._directory = Path(directory).absolute()
        self._keys: frozenset[str] | None = frozenset(keys) if keys else None

    @property
    def directory(self) -> Path:
        """The folder holding the documents (absolute, symlinks not resolved)."""
        return self._directory

    @property
    def keys(self) -> frozenset[str] | None:
        """The allowlist, or None when every document is exposed."""
        return self._keys

    def __repr__(self) -> str:
        keys = "" if self._keys is None else f", keys={sorted(self._keys)!r}"
        return f"FileSkillProvider({str(self._directory)!r}{keys})"

    def _allowed(self, key: str) -> bool:
        return self._keys is None or key in self._keys

    def _resolve(self, key: object) -> tuple[Path, str | None]:
        """The path for ``key`` and, if it may not be used, why not."""
        problem = _key_problem(key)
        if problem is not None:
            return self._directory, problem
        assert isinstance(key, str)
        root = self._directory.resolve()
        path = root / key
        if not path.resolve().is_relative_to(root):
            return path, "must stay inside the skills folder"
        return path, None

    def _inside(self, path: Path) -> bool:
        return path.resolve().is_relative_to(self._directory.resolve())

    async def get(self) -> str | None:
        """One line per document, ``- <key>`` plus ``: <description>`` if it has one.

        Sorted by key (code point order, which is also R2's UTF-8 byte order); None when no
        document is exposed.
        """
        return await asyncio.to_thread(self._get)

    def _get(self) -> str | None:
        root = self._directory.resolve()
        if not root.is_dir():
            return None
        found: list[tuple[str, Path]] = []
        # Symlinked folders are not descended into: a link cycle would walk forever.
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            base = Path(dirpath)
            for name in filenames:
                if name.startswith("."):
                    continue
                path = base / name
                key = path.relative_to(root).as_posix()
                # Checked before any other work so a disallowed document is never read.
                if not self._allowed(key):
                    continue
                # The same rules as load, so nothing is listed that load would refuse
                # (a symlink to a file outside the folder, an odd name).
                if _key_problem(key) is not None or not self._inside(path):
                    continue
                if path.is_file():
                    found.append((key, path))
        if not found:
            return None
        lines: list[str] = []
        for key, path in sorted(found):
            sidecar = _sidecar(path)
            description = _read_text(sidecar) if self._inside(sidecar) else None
            lines.append(f"- {key}: {description}" if description else f"- {key}")
        return "\n".join(lines)

    async def load(self, key: str) -> str | None:
        """The document's text, or None if it is not allowed, not a valid key or missing."""
        if not isinstance(key, str) or not self._allowed(key):
            return None
        return await asyncio.to_thread(self._load, key)

    def _load(self, key: str) -> str | None:
        path, problem = self._resolve(key)
        if problem is not None:
            return None
        return _read_text(path)

    async def set(self, key: str, content: str, description: str | None = None) -> None:
        """Write a document (atomically) and its description; not limited by the allowlist.

        ``description`` None or ``""`` removes an existing description. Raises
        :class:`~protocol.errors.InvalidInput` for an invalid key; an ``OSError`` when the file
        system refuses (say, ``a/b`` while ``a`` is a document).
        """
        if not isinstance(content, str):
            raise InvalidInput(f"skill content must be a str, not {type(content).__name__}")
        if description is not None and not isinstance(description, str):
            raise InvalidInput(f"skill description must be a str or None, not {type(description).__name__}")
        # Validated here, not only in the thread, so the error surfaces even before any I/O.
        problem = _key_problem(key)
        if problem is not None:
            raise InvalidInput(f"invalid skill key {key!r}: {problem}")
        try:
            # Encoded up front: a lone surrogate must fail before anything is written.
            data = content.encode("utf-8")
            about = description.encode("utf-8") if description else None
        except UnicodeEncodeError as exc:
            raise InvalidInput(f"skill {key!r} is not encodable as UTF-8: {exc.reason}") from exc
        await asyncio.to_thread(self._set, key, data, about)

    def _set(self, key: str, data: bytes, description: bytes | None) -> None:
        path, problem = self._resolve(key)
        if problem is not None:
            raise InvalidInput(f"invalid skill key {key!r}: {problem}")
        path.parent.mkdir(parents=True, exist_ok=True)
        # Document first: a listing between the two writes shows the new document with its
        # old description, never a description for a document that is not there yet.
        _write_atomic(path, data)
        sidecar = _sidecar(path)
        if description:
            _write_atomic(sidecar, description)
        else:
            sidecar.unlink(missing_ok=True)
