"""keel.server.engine — the durable mission engine: host loop, task graph, journal, checkpoints, agents.

Depends on keel.protocol and keel.storage (and keel.server.tools for host-side tools); never on the
language server. control.py is the API the CLI and the language server call.
"""
