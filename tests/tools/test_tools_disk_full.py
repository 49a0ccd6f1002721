"""The effectful tools on a real, full tmpfs: a write that fails for want of space, or a command that fails
while the sandbox's filesystem is full, raises DiskFullError naming the mount (the engine pauses and
journals nothing); what a full disk does not explain stays an ordinary result."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.protocol.errors import DiskFullError
from keel.server.tools import TOOLS, ToolContext
from tests.tmpfs import fill, mounted


@pytest.fixture
def full_box(tmp_path: Path) -> Iterator[ToolContext]:
    """A sandbox on a 1 MiB tmpfs that a ballast file has filled to the last byte."""
    with mounted(tmp_path / "mnt", "1m") as mnt:
        root = mnt / "sandbox"
        root.mkdir()
        (root / "notes.txt").write_text("alpha\n")
        fill(mnt)
        yield ToolContext(sandbox=root, timeout_s=20.0)


def _names_the_mount(exc: DiskFullError, box: ToolContext) -> None:
    mount = box.sandbox.parent
    assert exc.message.startswith(f"disk full: the filesystem mounted at {mount} (0 KiB free)"), exc.message
    assert exc.mount == str(mount)


async def test_write_file_on_a_full_disk_raises_and_leaves_nothing(full_box: ToolContext) -> None:
    with pytest.raises(DiskFullError) as info:
        await TOOLS["write_file"].run(full_box, {"path": "new.txt", "content": "x" * 10_000})
    _names_the_mount(info.value, full_box)
    assert "No space left on device" in info.value.message
    assert sorted(p.name for p in full_box.sandbox.iterdir()) == ["notes.txt"]  # no temp file left behind


async def test_apply_diff_on_a_full_disk_raises_and_changes_nothing(full_box: ToolContext) -> None:
    diff = "--- a/notes.txt\n+++ b/notes.txt\n@@ -1 +1,2 @@\n alpha\n+" + "b" * 10_000 + "\n"
    with pytest.raises(DiskFullError) as info:
        await TOOLS["apply_diff"].run(full_box, {"diff": diff})
    _names_the_mount(info.value, full_box)
    assert (full_box.sandbox / "notes.txt").read_text() == "alpha\n"


async def test_a_command_failing_on_a_full_sandbox_is_a_full_disk(full_box: ToolContext) -> None:
    with pytest.raises(DiskFullError) as info:
        await TOOLS["run"].run(full_box, {"cmd": "head -c 10000 /dev/zero > new.bin"})
    _names_the_mount(info.value, full_box)
    assert "exited with code 1" in info.value.message


async def test_a_command_that_succeeds_on_a_full_disk_is_a_result(full_box: ToolContext) -> None:
    result = await TOOLS["run"].run(full_box, {"cmd": "cat notes.txt"})
    assert result.ok and result.output["stdout"] == "alpha\n"


async def test_a_failing_command_with_room_to_spare_is_a_result(tmp_path: Path) -> None:
    box = ToolContext(sandbox=tmp_path, timeout_s=20.0)
    result = await TOOLS["run"].run(box, {"cmd": "exit 4", "verify": True})
    assert not result.ok and result.output["exit_code"] == 4 and "verification failed" in result.error


async def test_a_command_that_failed_for_want_of_space_and_removed_its_output_is_a_full_disk(tmp_path: Path) -> None:
    """Room is left once it has ended (it removed what it could not finish): its words tell."""
    with mounted(tmp_path / "mnt", "1m") as mnt:
        root = mnt / "sandbox"
        root.mkdir()
        fill(mnt, leave=400 * 1024)
        box = ToolContext(sandbox=root, timeout_s=20.0)
        cmd = "head -c 600000 /dev/zero > out.bin || { rm -f out.bin; exit 2; }"
        with pytest.raises(DiskFullError) as info:
            await TOOLS["run"].run(box, {"cmd": cmd, "verify": True})
        assert "exited with code 2: it said there is no space left" in info.value.message
        assert info.value.mount == str(mnt)


async def test_a_command_failing_while_keel_met_a_full_disk_there_is_a_full_disk(tmp_path: Path) -> None:
    """The store spent its reserve on the sandbox's filesystem meanwhile: the room seen afterwards is the
    reserve's, so a failure then is the full disk's; a command that passes is still a result."""
    met = "disk full: the filesystem mounted at /x (0 KiB free) cannot take a write to the store at /x/store"
    box = ToolContext(sandbox=tmp_path, timeout_s=20.0, full_disk=lambda: met)
    with pytest.raises(DiskFullError) as info:
        await TOOLS["run"].run(box, {"cmd": "exit 3", "verify": True})
    assert "exited with code 3: a write of keel's there met a full disk meanwhile" in info.value.message
    result = await TOOLS["run"].run(box, {"cmd": "echo fine"})
    assert result.ok and result.output["stdout"] == "fine\n"
