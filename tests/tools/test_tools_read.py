"""read_file, list_files and search on real files in tmp_path, including every escape attempt."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from keel.protocol.agent import ToolRunResult
from keel.server.tools import TOOLS, ToolContext


@pytest.fixture
def box(tmp_path: Path) -> ToolContext:
    root = tmp_path / "sandbox"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "app.py").write_text("import os\n\ndef main():\n    return 42\n")
    (root / "src" / "pkg" / "util.py").write_text("def helper():\n    return 'x'\n")
    (root / "README.md").write_text("# Demo\nmain entry\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("main secret\n")
    (root / ".keel").mkdir()
    (root / ".keel" / "state.py").write_text("main\n")
    (root / "blob.bin").write_bytes(b"\0\1\2main")
    (tmp_path / "outside.txt").write_text("main outside\n")
    return ToolContext(sandbox=root)


async def call(ctx: ToolContext, tool: str, **args: Any) -> ToolRunResult:
    return await TOOLS[tool].run(ctx, args)


async def test_read_file_whole_and_range(box: ToolContext) -> None:
    whole = await call(box, "read_file", path="src/app.py")
    assert whole.ok and whole.output["content"] == "import os\n\ndef main():\n    return 42\n"
    assert whole.output["total_lines"] == 4 and not whole.output["truncated"]
    part = await call(box, "read_file", path="./src/../src/app.py", start_line=3, end_line=4)
    assert part.output["content"] == "def main():\n    return 42\n"
    assert (part.output["start_line"], part.output["end_line"], part.output["path"]) == (3, 4, "src/app.py")


async def test_read_file_size_cap(box: ToolContext) -> None:
    (box.sandbox / "big.txt").write_text("".join(f"line {n}\n" for n in range(10000)))
    result = await call(box, "read_file", path="big.txt", max_bytes=100)
    assert result.ok and result.output["truncated"] and len(result.output["content"]) <= 100
    assert result.output["content"].startswith("line 0\nline 1\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"path": "/etc/passwd"}, "'/etc/passwd' is absolute"),
        ({"path": "../outside.txt"}, "'../outside.txt' escapes the sandbox"),
        ({"path": "src/../../outside.txt"}, "escapes the sandbox"),
        ({"path": "missing.py"}, "'missing.py' does not exist"),
        ({"path": "src"}, "'src' is a folder"),
        ({"path": "blob.bin"}, "'blob.bin' is binary"),
        ({}, "missing required argument 'path'"),
        ({"path": 3}, "argument 'path' must be str"),
        ({"path": "src/app.py", "start_line": 5, "end_line": 2}, "line range 5..2"),
    ],
)
async def test_read_file_errors(box: ToolContext, args: dict[str, Any], message: str) -> None:
    result = await TOOLS["read_file"].run(box, args)
    assert not result.ok and message in result.error


async def test_symlink_out_of_the_sandbox_is_refused(box: ToolContext, tmp_path: Path) -> None:
    os.symlink(tmp_path / "outside.txt", box.sandbox / "link.txt")
    os.symlink(tmp_path, box.sandbox / "linkdir")
    os.symlink("src/app.py", box.sandbox / "inner.py")
    for path in ("link.txt", "linkdir/outside.txt"):
        result = await call(box, "read_file", path=path)
        assert not result.ok and f"path {path!r} resolves to" in result.error and "outside the sandbox" in result.error
    assert (await call(box, "read_file", path="inner.py")).output["content"].startswith("import os")
    found = await call(box, "search", pattern="outside")
    assert found.ok and found.output["matches"] == []  # the link is not followed out of the sandbox


async def test_list_files_globs_and_hidden_folders(box: ToolContext) -> None:
    everything = await call(box, "list_files")
    assert everything.output == {
        "files": ["README.md", "blob.bin", "src/app.py", "src/pkg/util.py"],
        "truncated": False,
    }
    py = await call(box, "list_files", glob="*.py")
    assert py.output["files"] == ["src/app.py", "src/pkg/util.py"]
    assert (await call(box, "list_files", glob="src/*.py")).output["files"] == ["src/app.py"]
    assert (await call(box, "list_files", glob="src/**/*.py")).output["files"] == ["src/app.py", "src/pkg/util.py"]
    assert (await call(box, "list_files", path="src/pkg")).output["files"] == ["src/pkg/util.py"]
    capped = await call(box, "list_files", max_results=2)
    assert capped.output == {"files": ["README.md", "blob.bin"], "truncated": True}
    assert "escapes the sandbox" in (await call(box, "list_files", path="..")).error


async def test_search(box: ToolContext) -> None:
    found = await call(box, "search", pattern=r"def \w+\(")
    assert found.output["matches"] == [
        {"path": "src/app.py", "line": 3, "text": "def main():"},
        {"path": "src/pkg/util.py", "line": 1, "text": "def helper():"},
    ]
    main = await call(box, "search", pattern="MAIN", ignore_case=True)
    assert [m["path"] for m in main.output["matches"]] == ["README.md", "src/app.py"]  # not .git, .keel or binary
    only = await call(box, "search", pattern="return", glob="util.py")
    assert only.output["matches"] == [{"path": "src/pkg/util.py", "line": 2, "text": "    return 'x'"}]
    capped = await call(box, "search", pattern=".", max_results=3)
    assert len(capped.output["matches"]) == 3 and capped.output["truncated"]
    bad = await call(box, "search", pattern="(unclosed")
    assert not bad.ok and "'(unclosed' is not a valid regular expression" in bad.error


def test_read_only_tools_reconcile_as_safe_to_rerun(box: ToolContext) -> None:
    for name in ("read_file", "list_files", "search"):
        tool = TOOLS[name]
        assert tool.klass == "read_only"
        assert tool.reconcile(box, tool.preview(box, {"path": "x"})).done is False
