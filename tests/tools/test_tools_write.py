"""write_file and apply_diff on real files: atomic writes, the diff applier's checks, reconcile verdicts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from keel.server.tools import TOOLS, ToolContext, ToolError

APP = "import os\n\n\ndef main():\n    return 42\n\n\nprint(main())\n"


@pytest.fixture
def box(tmp_path: Path) -> ToolContext:
    root = tmp_path / "sandbox"
    root.mkdir()
    (root / "app.py").write_text(APP)
    (root / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    return ToolContext(sandbox=root)


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.name.endswith(".keel-tmp"))


async def test_write_file_creates_replaces_and_returns_the_diff(box: ToolContext) -> None:
    write = TOOLS["write_file"]
    created = await write.run(box, {"path": "pkg/new.py", "content": "x = 1\n"})
    assert created.ok and created.output["created"] and created.output["bytes"] == 6
    assert created.output["diff"] == "--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1 @@\n+x = 1\n"
    os.chmod(box.sandbox / "notes.txt", 0o755)
    replaced = await write.run(box, {"path": "notes.txt", "content": "alpha\nBETA\ngamma\n"})
    assert not replaced.output["created"]
    assert "-beta\n+BETA\n" in replaced.output["diff"]
    assert (box.sandbox / "notes.txt").read_text() == "alpha\nBETA\ngamma\n"
    assert (box.sandbox / "notes.txt").stat().st_mode & 0o777 == 0o755  # the mode survives the rename
    assert leftovers(box.sandbox) == []


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/tmp/x", "is absolute"),
        ("../x", "escapes the sandbox"),
        (".git/config", "inside .git/"),
        (".keel/x", "inside .keel/"),
        (".", "the sandbox folder itself"),
        ("sub", "'sub' is a folder"),
    ],
)
async def test_write_file_refuses_bad_paths(box: ToolContext, path: str, message: str) -> None:
    (box.sandbox / "sub").mkdir()
    result = await TOOLS["write_file"].run(box, {"path": path, "content": "x"})
    assert not result.ok and message in result.error
    with pytest.raises(ToolError, match=message):
        TOOLS["write_file"].preview(box, {"path": path, "content": "x"})


async def test_write_file_through_symlinked_folder_outside_is_refused(box: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", box.sandbox / "out")
    result = await TOOLS["write_file"].run(box, {"path": "out/evil.txt", "content": "x"})
    assert not result.ok and "'out/evil.txt' resolves to" in result.error
    assert list((tmp_path / "elsewhere").iterdir()) == []


async def test_write_file_reconcile(box: ToolContext) -> None:
    write = TOOLS["write_file"]
    args = {"path": "notes.txt", "content": "new\n"}
    intent = write.preview(box, args)
    assert intent["before"] and intent["after"] and intent["path"] == "notes.txt"
    assert write.reconcile(box, intent).done is False  # crash before the rename: safe to run
    result = await write.run(box, args)
    verdict = write.reconcile(box, intent)  # crash after the rename, before the result was recorded
    assert verdict.done is True and verdict.result == result
    (box.sandbox / "notes.txt").write_text("someone else\n")
    unknown = write.reconcile(box, intent)
    assert unknown.done is None and "changed by something else: ['notes.txt']" in unknown.reason
    fresh = write.preview(box, {"path": "fresh.txt", "content": "1"})
    assert fresh["before"] is None and write.reconcile(box, fresh).done is False


MULTI = """\
diff --git a/app.py b/app.py
--- a/app.py
+++ b/app.py
@@ -4,2 +4,3 @@
 def main():
-    return 42
+    value = 6 * 7
+    return value
@@ -8 +9 @@
-print(main())
+print("answer", main())
--- /dev/null
+++ b/docs/readme.md
@@ -0,0 +1,2 @@
+# App
+Prints the answer.
--- a/notes.txt
+++ /dev/null
@@ -1,3 +0,0 @@
-alpha
-beta
-gamma
"""


async def test_apply_diff_changes_creates_and_deletes(box: ToolContext) -> None:
    result = await TOOLS["apply_diff"].run(box, {"diff": MULTI})
    assert result.ok, result.error
    assert (box.sandbox / "app.py").read_text() == APP.replace(
        "    return 42\n", "    value = 6 * 7\n    return value\n"
    ).replace("print(main())", 'print("answer", main())')
    assert (box.sandbox / "docs" / "readme.md").read_text() == "# App\nPrints the answer.\n"
    assert not (box.sandbox / "notes.txt").exists()
    assert set(result.output["files"]) == {"app.py", "docs/readme.md", "notes.txt"}
    assert result.output["files"]["notes.txt"]["after"] is None and result.output["diff"] == MULTI


async def test_apply_diff_finds_moved_context(box: ToolContext) -> None:
    (box.sandbox / "app.py").write_text("# header\n# more\n" + APP)
    diff = "--- a/app.py\n+++ b/app.py\n@@ -5,1 +5,1 @@\n-    return 42\n+    return 43\n"
    assert (await TOOLS["apply_diff"].run(box, {"diff": diff})).ok
    assert "    return 43\n" in (box.sandbox / "app.py").read_text()


BAD_DIFFS = [
    (
        "--- a/app.py\n+++ b/app.py\n@@ -1,1 +1,1 @@\n-import os\n+import sys\n@@ -5,1 +5,1 @@\n-    return 41\n"
        "+    return 0\n",
        "app.py: hunk 2 (@@ -5,1 +5,1 @@) does not apply: line 5 is '    return 42' "
        "but the hunk expects '    return 41'",
    ),
    ("--- a/app.py\n+++ b/app.py\n@@ -1,2 +1,2 @@\n-import os\n+import sys\n", "hunk 1 (@@ -1,2 +1,2 @@) ends early"),
    ("--- a/app.py\n+++ b/app.py\n@@ -1 +1 @@\n*import os\n+x\n", "starts with neither"),
    ("--- a/app.py\n+++ b/app.py\n@@ bogus @@\n", "hunk 1 header '@@ bogus @@'"),
    ("just some text\n", "not a unified diff"),
    ("--- a/gone.py\n+++ b/gone.py\n@@ -1 +1 @@\n-a\n+b\n", "gone.py: the diff changes this file, but it does not"),
    ("--- /dev/null\n+++ b/app.py\n@@ -0,0 +1 @@\n+x\n", "app.py: the diff creates this file, but it already exists"),
    ("--- a/../x\n+++ b/../x\n@@ -1 +1 @@\n-a\n+b\n", "escapes the sandbox"),
    ("--- a/notes.txt\n+++ /dev/null\n@@ -1,1 +0,0 @@\n-alpha\n", "hunks leave content behind"),
]


@pytest.mark.parametrize(("diff", "message"), BAD_DIFFS)
async def test_apply_diff_errors_change_nothing(box: ToolContext, diff: str, message: str) -> None:
    prefix = "--- /dev/null\n+++ b/first.txt\n@@ -0,0 +1 @@\n+would be created\n"  # all-or-nothing across files
    texts = (diff,) if "not a unified diff" in message else (diff, prefix + diff)  # text after a file is comment
    for text in texts:
        result = await TOOLS["apply_diff"].run(box, {"diff": text})
        assert not result.ok and message in result.error, result.error
    assert (box.sandbox / "app.py").read_text() == APP and not (box.sandbox / "first.txt").exists()
    assert sorted(p.name for p in box.sandbox.iterdir()) == ["app.py", "notes.txt"]


async def test_apply_diff_line_endings_and_missing_final_newline(box: ToolContext) -> None:
    (box.sandbox / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    (box.sandbox / "noeol.txt").write_bytes(b"a\nb")
    diff = (
        "--- a/crlf.txt\n+++ b/crlf.txt\n@@ -1,2 +1,3 @@\n one\n+one and a half\n two\n"
        "--- a/noeol.txt\n+++ b/noeol.txt\n@@ -1,2 +1,3 @@\n a\n b\n+c\n"
    )
    assert (await TOOLS["apply_diff"].run(box, {"diff": diff})).ok
    assert (box.sandbox / "crlf.txt").read_bytes() == b"one\r\none and a half\r\ntwo\r\n"
    assert (box.sandbox / "noeol.txt").read_bytes() == b"a\nb\nc\n"
    keep = "--- a/noeol.txt\n+++ b/noeol.txt\n@@ -3 +3 @@\n-c\n+d\n\\ No newline at end of file\n"
    assert (await TOOLS["apply_diff"].run(box, {"diff": keep})).ok
    assert (box.sandbox / "noeol.txt").read_bytes() == b"a\nb\nd"


async def test_write_file_diff_applies_back(box: ToolContext) -> None:
    """The diff write_file returns is one apply_diff accepts: undoing it by hand restores the file."""
    before = (box.sandbox / "app.py").read_text()
    changed = await TOOLS["write_file"].run(box, {"path": "app.py", "content": before.replace("42", "7")})
    (box.sandbox / "app.py").write_text(before)
    assert (await TOOLS["apply_diff"].run(box, {"diff": changed.output["diff"]})).ok
    assert (box.sandbox / "app.py").read_text() == before.replace("42", "7")


async def test_apply_diff_reconcile(box: ToolContext) -> None:
    tool = TOOLS["apply_diff"]
    args: dict[str, Any] = {"diff": MULTI}
    intent = tool.preview(box, args)
    assert tool.reconcile(box, intent).done is False
    result = await tool.run(box, args)
    verdict = tool.reconcile(box, intent)
    assert verdict.done is True and verdict.result == result
    (box.sandbox / "notes.txt").write_text("alpha\nbeta\ngamma\n")  # as if one rename had not happened
    partial = tool.reconcile(box, intent)
    assert partial.done is None and "unchanged: ['notes.txt']" in partial.reason
    assert "changed as intended: ['app.py', 'docs/readme.md']" in partial.reason
    with pytest.raises(ToolError, match="does not apply"):  # applied already: a second preview says why
        tool.preview(box, {"diff": MULTI.split("--- /dev/null")[0]})
