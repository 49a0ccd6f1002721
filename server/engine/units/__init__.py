"""A unit's run, owned by `unitrun.UnitSession` (its recorder journals every step, its handlers answer the
agent, its worker process runs it): its lease and worker process, recovery's decisions, units offered to
`keel worker`s, a unit moved to another machine, and what a superseded lane leaves behind."""
