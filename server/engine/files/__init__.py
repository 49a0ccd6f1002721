"""A unit's files: sandboxes and their snapshots (folder trees, git bases), merging into the mission's
sandbox, and where a mission's files live (places). Depends on nothing else of the engine."""
