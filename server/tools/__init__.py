"""Host-side tools that run inside a mission's sandbox folder: the registry the engine dispatches to.

    from keel.server.tools import TOOLS, ToolContext, Tool, Reconciled, ToolError

TOOLS maps each tool name to its implementation. Classes: read_file, list_files and search are
`read_only`; write_file, apply_diff and run are `effectful` (the engine records `preview()` before
running them and calls `reconcile()` after a crash; see base.py for the error contract and writers.py
for why the file tools are not classed `idempotent`). Their descriptions and JSON schemas are declared once,
in keel.protocol.tools, which agents that offer these tools to a model (agents/coder.py) use as well.
Depends on keel.protocol and the stdlib only; never on storage, the engine or LSP code.
"""

from __future__ import annotations

from keel.server.tools.base import Reconciled, Tool, ToolClass, ToolContext, ToolError, failure
from keel.server.tools.readers import ListFiles, ReadFile, Search
from keel.server.tools.shell import Run
from keel.server.tools.writers import ApplyDiff, WriteFile

TOOLS: dict[str, Tool] = {
    tool.name: tool for tool in (ReadFile(), ListFiles(), Search(), WriteFile(), ApplyDiff(), Run())
}

__all__ = ["TOOLS", "Reconciled", "Tool", "ToolClass", "ToolContext", "ToolError", "failure"]
