"""FileSkillProvider: the R2SkillProvider cases of ``session/skills.test.ts``, over a folder.

Real files in ``tmp_path``. Where the original counted ``bucket.get`` calls, these tests
record the paths handed to the module's file-reading helper.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from hub import skills
from hub.skills import FileSkillProvider
from protocol.errors import InvalidInput

ESCAPES = ["../x", "/etc/passwd", "a/../../x", "a\x00b", ".hidden", "a//b"]
MORE_INVALID = ["", ".", "..", "a/./b", "a/", "a\\b", "C:x", "team/.secret", "..\\x"]


def write_doc(root: Path, key: str, content: str, description: str | None = None) -> None:
    """A document laid out as FileSkillProvider stores it (sidecar for the description)."""
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
    if description is not None:
        (path.parent / f".{path.name}.description").write_text(description, encoding="utf-8")


@pytest.fixture
def skills_dir(tmp_path: Path) -> Path:
    root = tmp_path / "skills"
    write_doc(root, "tax", "Tax body", "Tax workflows")
    write_doc(root, "bank-reconciliation", "Bank body", "Bank reconciliation")
    write_doc(root, "hidden", "Hidden body", "Hidden workflow")
    return root


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every path the provider reads, in order."""
    seen: list[Path] = []
    real = skills._read_text

    def recording(path: Path) -> str | None:
        seen.append(path)
        return real(path)

    monkeypatch.setattr(skills, "_read_text", recording)
    return seen


def real(path: Path) -> Path:
    return path.resolve()


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def files_under(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


# -- allowlist (PR #1477) -------------------------------------------------------------------


async def test_filters_listing_to_configured_keys(skills_dir: Path) -> None:
    provider = FileSkillProvider(skills_dir, keys=["tax", "bank-reconciliation"])
    listing = await provider.get()
    # The original's mock listed tax first; a folder lists in key order, as R2 does.
    assert listing == "- bank-reconciliation: Bank reconciliation\n- tax: Tax workflows"


async def test_listing_matches_the_r2_string_when_sorted_order_agrees(tmp_path: Path) -> None:
    # The original's exact string, with keys whose sorted order is tax first.
    root = tmp_path / "skills"
    write_doc(root, "a/tax", "Tax body", "Tax workflows")
    write_doc(root, "b/bank-reconciliation", "Bank body", "Bank reconciliation")
    write_doc(root, "c/hidden", "Hidden body", "Hidden workflow")
    provider = FileSkillProvider(root, keys=["a/tax", "b/bank-reconciliation"])
    assert await provider.get() == ("- a/tax: Tax workflows\n- b/bank-reconciliation: Bank reconciliation")


async def test_does_not_read_disallowed_keys(skills_dir: Path, reads: list[Path]) -> None:
    provider = FileSkillProvider(skills_dir, keys=["tax"])
    assert await provider.load("tax") == "Tax body"
    assert await provider.load("hidden") is None
    assert reads == [real(skills_dir) / "tax"]


async def test_disallowed_load_never_reaches_a_thread(
    skills_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = FileSkillProvider(skills_dir, keys=["tax"])

    async def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the file system was touched")

    monkeypatch.setattr(asyncio, "to_thread", forbidden)
    assert await provider.load("hidden") is None
    assert await provider.load("../tax") is None


async def test_listing_reads_no_disallowed_description(skills_dir: Path, reads: list[Path]) -> None:
    provider = FileSkillProvider(skills_dir, keys=["tax"])
    assert await provider.get() == "- tax: Tax workflows"
    assert reads == [real(skills_dir) / ".tax.description"]


@pytest.mark.parametrize("keys", [None, []])
async def test_omitted_or_empty_keys_expose_everything(tmp_path: Path, keys: list[str] | None) -> None:
    root = tmp_path / "skills"
    write_doc(root, "tax", "Tax body")
    write_doc(root, "hidden", "Hidden body")
    provider = FileSkillProvider(root) if keys is None else FileSkillProvider(root, keys=keys)
    assert provider.keys is None
    assert await provider.get() == "- hidden\n- tax"
    assert await provider.load("hidden") == "Hidden body"


async def test_set_is_not_restricted_by_the_allowlist(skills_dir: Path) -> None:
    provider = FileSkillProvider(skills_dir, keys=["tax"])
    await provider.set("hidden", "Updated", "Hidden workflow v2")
    assert (skills_dir / "hidden").read_text(encoding="utf-8") == "Updated"
    assert (skills_dir / ".hidden.description").read_text(encoding="utf-8") == ("Hidden workflow v2")
    # Still not exposed: the allowlist governs reads only.
    assert await provider.load("hidden") is None
    assert await provider.get() == "- tax: Tax workflows"
    assert await FileSkillProvider(skills_dir).load("hidden") == "Updated"


def test_keys_as_a_bare_string_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="not a single str"):
        FileSkillProvider(tmp_path, keys="tax")


# -- listing --------------------------------------------------------------------------------


async def test_get_on_missing_folder_is_none(tmp_path: Path) -> None:
    provider = FileSkillProvider(tmp_path / "nope")
    assert await provider.get() is None
    assert await provider.load("tax") is None
    assert not (tmp_path / "nope").exists()


async def test_get_on_empty_folder_is_none(tmp_path: Path) -> None:
    (tmp_path / ".only-hidden").write_text("x", encoding="utf-8")
    assert await FileSkillProvider(tmp_path).get() is None


async def test_listing_skips_hidden_files_and_folders(tmp_path: Path) -> None:
    write_doc(tmp_path, "visible", "v")
    write_doc(tmp_path, ".dotfile", "d")
    write_doc(tmp_path, ".git/config", "c")
    write_doc(tmp_path, "team/.draft", "x")
    write_doc(tmp_path, "team/deploy", "Deploy body", "Deploying")
    assert await FileSkillProvider(tmp_path).get() == "- team/deploy: Deploying\n- visible"


async def test_listing_is_sorted_by_full_key(tmp_path: Path) -> None:
    # Sorted on the key string, not walk order: "a-b" < "a/b" < "a0" in code point order.
    for key in ["a0", "a/b", "a-b", "B", "z"]:
        write_doc(tmp_path, key, key)
    assert await FileSkillProvider(tmp_path).get() == "- B\n- a-b\n- a/b\n- a0\n- z"


async def test_empty_sidecar_means_no_description(tmp_path: Path) -> None:
    write_doc(tmp_path, "tax", "Tax body", "")
    assert await FileSkillProvider(tmp_path).get() == "- tax"


# -- set / load -----------------------------------------------------------------------------


async def test_set_with_description_then_get_shows_it(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    provider = FileSkillProvider(root)
    await provider.set("pirate-style", "Talk like a pirate.", "Pirate voice")
    assert root.is_dir()
    assert await provider.get() == "- pirate-style: Pirate voice"
    assert await provider.load("pirate-style") == "Talk like a pirate."


async def test_set_without_description_removes_the_sidecar(tmp_path: Path) -> None:
    provider = FileSkillProvider(tmp_path)
    await provider.set("tax", "v1", "Tax workflows")
    assert (tmp_path / ".tax.description").exists()
    await provider.set("tax", "v2")
    assert not (tmp_path / ".tax.description").exists()
    assert await provider.get() == "- tax"
    await provider.set("tax", "v3", "Again")
    await provider.set("tax", "v4", "")
    assert not (tmp_path / ".tax.description").exists()
    assert await provider.load("tax") == "v4"


async def test_set_replaces_atomically_and_leaves_no_temp_files(tmp_path: Path) -> None:
    provider = FileSkillProvider(tmp_path)
    await provider.set("tax", "old " * 1000, "Old")
    inode_before = (tmp_path / "tax").stat().st_ino
    await provider.set("tax", "new", "New")
    assert await provider.load("tax") == "new"
    assert await provider.get() == "- tax: New"
    # A new file was renamed over the old one rather than the old one rewritten in place.
    assert (tmp_path / "tax").stat().st_ino != inode_before
    assert names(tmp_path) == [".tax.description", "tax"]


async def test_failed_write_leaves_old_document_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = FileSkillProvider(tmp_path)
    await provider.set("tax", "old")

    def failing_replace(src: object, dst: object) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk on fire"):
        await provider.set("tax", "new")
    monkeypatch.undo()
    assert await provider.load("tax") == "old"
    assert names(tmp_path) == ["tax"]


async def test_written_file_gets_a_umask_mode_not_0600(tmp_path: Path) -> None:
    await FileSkillProvider(tmp_path).set("tax", "x")
    probe = tmp_path / "probe"
    probe.write_text("x", encoding="utf-8")
    assert (tmp_path / "tax").stat().st_mode == probe.stat().st_mode


async def test_nested_keys(tmp_path: Path) -> None:
    provider = FileSkillProvider(tmp_path / "skills")
    await provider.set("team/deploy", "Ship it.", "Deploy runbook")
    await provider.set("team/ops/pager", "Wake up.")
    root = tmp_path / "skills"
    assert files_under(root) == ["team/.deploy.description", "team/deploy", "team/ops/pager"]
    assert await provider.get() == "- team/deploy: Deploy runbook\n- team/ops/pager"
    assert await provider.load("team/deploy") == "Ship it."
    assert await provider.load("team") is None  # a folder is not a document
    assert await provider.load("team/deploy/x") is None  # a document is not a folder


async def test_nested_key_under_a_document_fails_with_oserror(tmp_path: Path) -> None:
    provider = FileSkillProvider(tmp_path)
    await provider.set("team", "a document")
    with pytest.raises(OSError):  # noqa: PT011 - the OS picks the subclass
        await provider.set("team/deploy", "x")


async def test_load_missing_key_is_none(tmp_path: Path) -> None:
    provider = FileSkillProvider(tmp_path)
    await provider.set("tax", "x")
    assert await provider.load("nope") is None
    assert await provider.load("nope/deeper") is None


async def test_unicode_round_trip(tmp_path: Path) -> None:
    provider = FileSkillProvider(tmp_path)
    content = "Ünïcödé ✓ 中文技能 🙂\r\nsecond line\n\ttab\n"
    await provider.set("中文/技能", content, "描述 — émoji 🙂")
    assert await provider.load("中文/技能") == content
    assert (tmp_path / "中文" / "技能").read_bytes() == content.encode("utf-8")
    assert await provider.get() == "- 中文/技能: 描述 — émoji 🙂"


async def test_undecodable_bytes_are_replaced_not_raised(tmp_path: Path) -> None:
    (tmp_path / "bin").write_bytes(b"ok \xff\xfe end")
    assert await FileSkillProvider(tmp_path).load("bin") == "ok \ufffd\ufffd end"


async def test_unencodable_content_is_invalid_input(tmp_path: Path) -> None:
    provider = FileSkillProvider(tmp_path)
    with pytest.raises(InvalidInput, match="UTF-8"):
        await provider.set("tax", "lone \ud800 surrogate")
    assert names(tmp_path) == []


async def test_non_str_arguments_are_invalid_input(tmp_path: Path) -> None:
    provider = FileSkillProvider(tmp_path)
    with pytest.raises(InvalidInput, match="must be a str"):
        await provider.set(42, "x")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="content must be a str"):
        await provider.set("tax", None)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="description must be a str"):
        await provider.set("tax", "x", 3)  # type: ignore[arg-type]
    assert await provider.load(42) is None  # type: ignore[arg-type]


# -- escapes --------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ESCAPES + MORE_INVALID)
async def test_invalid_keys_are_refused(tmp_path: Path, key: str) -> None:
    root = tmp_path / "skills"
    provider = FileSkillProvider(root)
    with pytest.raises(InvalidInput, match="invalid skill key"):
        await provider.set(key, "pwned", "pwned")
    assert await provider.load(key) is None
    # Nothing written anywhere, not even the folder.
    assert files_under(tmp_path) == []


@pytest.mark.parametrize("key", ESCAPES)
async def test_escapes_cannot_read_existing_files(tmp_path: Path, key: str) -> None:
    root = tmp_path / "skills"
    write_doc(root, "a/inner", "inner")
    write_doc(root, ".hidden", "hidden")
    (tmp_path / "x").write_text("outside", encoding="utf-8")
    assert await FileSkillProvider(root).load(key) is None


async def test_symlink_pointing_outside_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("top secret", encoding="utf-8")
    root.mkdir()
    (root / "leak").symlink_to(outside / "secret")
    (root / "door").symlink_to(outside, target_is_directory=True)
    write_doc(root, "tax", "Tax body")
    provider = FileSkillProvider(root)

    assert await provider.load("leak") is None
    assert await provider.load("door/secret") is None
    assert await provider.get() == "- tax"  # the link is not listed either
    with pytest.raises(InvalidInput, match="inside the skills folder"):
        await provider.set("leak", "overwrite")
    with pytest.raises(InvalidInput, match="inside the skills folder"):
        await provider.set("door/new", "plant")
    assert (outside / "secret").read_text(encoding="utf-8") == "top secret"
    assert names(outside) == ["secret"]


async def test_symlinked_sidecar_pointing_outside_is_ignored(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    write_doc(root, "tax", "Tax body")
    (tmp_path / "secret").write_text("top secret", encoding="utf-8")
    (root / ".tax.description").symlink_to(tmp_path / "secret")
    assert await FileSkillProvider(root).get() == "- tax"


async def test_symlink_inside_the_folder_is_followed(tmp_path: Path) -> None:
    write_doc(tmp_path, "real", "Real body", "Real")
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    provider = FileSkillProvider(tmp_path)
    assert await provider.load("alias") == "Real body"
    assert await provider.get() == "- alias\n- real: Real"


async def test_folder_that_is_a_symlink_works(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    provider = FileSkillProvider(link)
    await provider.set("tax", "Tax body", "Tax workflows")
    assert (target / "tax").read_text(encoding="utf-8") == "Tax body"
    assert await provider.get() == "- tax: Tax workflows"


async def test_relative_folder_is_fixed_at_construction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    provider = FileSkillProvider("skills")
    assert provider.directory == tmp_path / "skills"
    os.mkdir(tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path / "elsewhere")
    await provider.set("tax", "x")
    assert (tmp_path / "skills" / "tax").is_file()
