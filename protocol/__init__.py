"""keel.protocol — the types every keel process shares.

Messages, stored records, mission specs and the agent wire format. Depends on the standard library and
msgspec only: agents import this package, so it must stay light and must never import storage, server,
pygls or lsprotocol.
"""

__version__ = "0.1.0"
