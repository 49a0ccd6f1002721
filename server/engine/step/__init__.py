"""A unit's steps: tool calls, effects and their decision, replay to a restarted agent, model calls, the
mission's policy and a unit's progress. Below the unit's run (units/), beside its files (files/)."""
