"""Which failed connections are a refusal for good (never retried) and which a server that is away, and how
an unreachable server is said to an operator."""

from __future__ import annotations

import pytest

from keel.storage.pgwords import refused_for_good, server_words, unreachable_why

AT = 'connection failed: connection to server at "10.0.0.1", port 5432 failed: '


@pytest.mark.parametrize(
    ("message", "refused"),
    [
        (AT + 'FATAL:  password authentication failed for user "keel"', True),
        (AT + "fe_sendauth: no password supplied", True),
        (AT + 'FATAL:  role "keel" does not exist', True),
        (AT + 'FATAL:  database "keel" does not exist', True),
        (AT + 'FATAL:  no pg_hba.conf entry for host "10.0.0.2", user "keel", database "keel", no encryption', True),
        (AT + 'FATAL:  role "keel" is not permitted to log in', True),
        (AT + 'FATAL:  permission denied for database "keel"', True),
        (AT + 'FATAL:  Ident authentication failed for user "keel"', True),
        (AT + "Connection refused\n\tIs the server running on that host and accepting TCP/IP connections?", False),
        (AT + "FATAL:  the database system is starting up", False),
        (AT + "FATAL:  the database system is shutting down", False),
        (AT + "FATAL:  sorry, too many clients already", False),
        (AT + "timeout expired", False),
        (AT + "server closed the connection unexpectedly", False),
        ('connection failed: could not translate host name "db.invalid" to address', False),
    ],
)
def test_refusals(message: str, refused: bool) -> None:
    assert refused_for_good(message) is refused


def test_the_servers_words() -> None:
    words = server_words(AT + 'FATAL:  password authentication failed for user "keel"')
    assert words == 'password authentication failed for user "keel"'


@pytest.mark.parametrize(
    ("message", "meaning"),
    [
        (AT + "server closed the connection unexpectedly\n\tThis probably means", "the connection to it was lost"),
        (AT + "Connection refused\n\tIs the server running on that host", "nothing accepts connections"),
        (AT + "timeout expired", "no answer within the connect timeout"),
        (AT + "FATAL:  the database system is starting up", "the server is starting up"),
        ('connection failed: could not translate host name "db.invalid" to address', "its host name does not resolve"),
    ],
)
def test_an_unreachable_server_is_said_in_an_operators_words(message: str, meaning: str) -> None:
    said = unreachable_why(message)
    assert said.startswith(meaning) and "\n" not in said and said.endswith("]"), said
