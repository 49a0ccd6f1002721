"""keel.agents.acp — outside coding agents (Claude Code, Gemini CLI, Codex, any ACP command) as keel agents.

    python -m keel.agents.acp claude|gemini|codex      (or: python -m keel.agents.acp -- COMMAND...)

A mission file names one with `agent = { acp = "claude" }` (or `{ acp = ["node", "agent.js"] }`).
The bridge speaks keel's agent protocol to the host (it journals by appending, see protocol.agent) and
the Agent Client Protocol to the outside agent. docs/acp-agents.md says what is journaled, replayed and
prompted again after a crash, per agent.
"""
