"""keel.server — the engine, supervisor, providers, the language server and the CLI.

The only package that imports pygls and lsprotocol. Depends on keel.protocol and keel.storage.
"""
