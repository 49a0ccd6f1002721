"""keel.server.lsp — the language server (`keel serve`): a view and control plane over one store.

Watches the store's transaction id, pushes what changed (`keel/missionChanged`, `$/progress`, questions,
failures), answers `keel/…` requests and runs commands through the engine's control API. The contract is
docs/lsp.md. Only this package (and server/commands/serve.py) imports pygls/lsprotocol.
"""
