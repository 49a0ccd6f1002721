"""What the agent did, for a person to follow: one reader of a mission's activity.

`items.py` turns stored records (journal entries, evidence, events, control requests) into
`ActivityItem`s; `reader.py` reads them in order, paged by an opaque cursor and filtered by unit, kind
and failure; `files.py` gives both sides of a recorded file change. `keel log` and the language server's
`keel/activity` both read through here, so the terminal and the editor show the same content.
Depends on storage and protocol only (prices come from the caller).
"""
