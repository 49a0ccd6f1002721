"""A unit's run and its one owner (`unitrun.UnitSession`, journaling every step): its lease and worker
process, recovery's decisions, units offered to `keel worker`s, a unit moved to another machine, and
what a superseded lane leaves behind."""
