"""The sandbox tools' interface, declared once: each tool's name, description and JSON schema.

The host's tools (server/tools) take their `description` and `parameters` from here, and agents that
offer the tools to a model (agents/coder.py) send these specs; an agent never imports keel.server, so
the one declaration lives in the protocol both sides share. The limits a schema states (READ_MAX_BYTES,
...) are the ones the tools enforce. Depends on the standard library, msgspec and keel.protocol only.
"""

from __future__ import annotations

from typing import Any

from keel.protocol.agent import ToolCallSpec

READ_MAX_BYTES = 256 * 1024  # read_file's max_bytes ceiling
LIST_MAX_RESULTS = 1000  # list_files' max_results ceiling
SEARCH_MAX_RESULTS = 100  # search's max_results ceiling

_PATH = {"type": "string", "description": "file path relative to the workspace root"}


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """A JSON schema for an arguments object: only the named properties, `required` ones must be given."""
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    schema["additionalProperties"] = False
    return schema


TOOL_SPECS: tuple[ToolCallSpec, ...] = (
    ToolCallSpec(
        name="read_file",
        description="Read a text file from the workspace, optionally only lines start_line..end_line (1-based, "
        "inclusive). Large files are cut at max_bytes.",
        parameters=_object(
            {
                "path": _PATH,
                "start_line": {"type": "integer", "minimum": 1},
                "end_line": {"type": "integer", "minimum": 1},
                "max_bytes": {"type": "integer", "minimum": 1, "maximum": READ_MAX_BYTES},
            },
            ("path",),
        ),
    ),
    ToolCallSpec(
        name="list_files",
        description="List files in the workspace (recursively) whose relative path matches a glob such as "
        "'**/*.py' or 'src/*.ts'; a glob without '/' matches file names in any folder.",
        parameters=_object(
            {
                "path": {
                    "type": "string",
                    "description": "folder to list, relative to the workspace root",
                    "default": ".",
                },
                "glob": {"type": "string", "default": "*"},
                "max_results": {"type": "integer", "minimum": 1, "maximum": LIST_MAX_RESULTS},
            }
        ),
    ),
    ToolCallSpec(
        name="search",
        description="Search text files in the workspace for a regular expression (Python syntax); returns "
        "matching lines with their path and line number.",
        parameters=_object(
            {
                "pattern": {"type": "string", "description": "regular expression"},
                "path": {"type": "string", "description": "file or folder to search", "default": "."},
                "glob": {"type": "string", "description": "only files matching this glob", "default": "*"},
                "ignore_case": {"type": "boolean", "default": False},
                "max_results": {"type": "integer", "minimum": 1, "maximum": SEARCH_MAX_RESULTS},
            },
            ("pattern",),
        ),
    ),
    ToolCallSpec(
        name="write_file",
        description="Create or replace a whole file in the workspace with the given content (parent folders "
        "are created). Returns the unified diff of the change.",
        parameters=_object(
            {"path": _PATH, "content": {"type": "string", "description": "the complete new content of the file"}},
            ("path", "content"),
        ),
    ),
    ToolCallSpec(
        name="apply_diff",
        description="Apply a unified diff (as made by `diff -u` or `git diff`) to one or more workspace files. "
        "Context lines must match the files; use /dev/null as the old name to create a file and as "
        "the new name to delete one. Either every file changes or none does.",
        parameters=_object(
            {"diff": {"type": "string", "description": "the unified diff, with ---/+++ headers"}}, ("diff",)
        ),
    ),
    ToolCallSpec(
        name="run",
        description="Run a shell command (/bin/sh -c) in the workspace and return its exit code and the tail of "
        "its output. Set verify=true when the command checks the work (tests, build, lint): the "
        "call then counts as passed only with exit code 0.",
        parameters=_object(
            {
                "cmd": {"type": "string", "description": "the shell command"},
                "cwd": {"type": "string", "description": "folder relative to the workspace root", "default": "."},
                "timeout_s": {"type": "number", "exclusiveMinimum": 0},
                "verify": {"type": "boolean", "default": False},
                "idempotent": {
                    "type": "boolean",
                    "default": False,
                    "description": "running the command twice has the same effect as once",
                },
            },
            ("cmd",),
        ),
    ),
)

#: Each tool's spec by name.
SPECS: dict[str, ToolCallSpec] = {spec.name: spec for spec in TOOL_SPECS}
