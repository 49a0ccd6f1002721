"""One table maps each agent method to its handler: no method of the protocol is left without one."""

from __future__ import annotations

from keel.protocol import agent as ap
from keel.server.engine.units.unitrun import HANDLERS, WAITS_FOR_A_PERSON


def test_every_agent_method_has_exactly_one_handler() -> None:
    assert set(HANDLERS) == set(ap.AGENT_METHODS)
    assert set(HANDLERS) >= WAITS_FOR_A_PERSON
