"""keel.agents."""
