"""What a PostgreSQL server or libpq says when keel cannot use it, in an operator's words."""

from __future__ import annotations

# What a server (or libpq) says when it will never let this connection in, however often it is tried.
_REFUSALS = (
    "password authentication failed",
    "no password supplied",
    "authentication failed",  # SCRAM, md5, ident, peer, cert
    "no pg_hba.conf entry",
    "pg_hba.conf rejects",
    "does not exist",  # a role or a database
    "is not permitted to log in",
    "permission denied for database",
    "password is required",
)


def refused_for_good(message: str) -> bool:
    """Whether a failed connection's message is a refusal of keel's credentials or role (permanent) rather
    than a server that is away, starting up, shutting down or full (worth waiting for)."""
    text = message.lower()
    return any(words in text for words in _REFUSALS)


# libpq's words for a server it cannot reach, and what they mean to an operator
_LOST = "the connection to it was lost (a network cut, or the server stopped)"
_UNREACHABLE = (
    ("server closed the connection unexpectedly", _LOST),
    ("connection refused", "nothing accepts connections at its address (the server is down or restarting)"),
    ("timeout expired", "no answer within the connect timeout (a network cut, or the server is overloaded)"),
    ("could not translate host name", "its host name does not resolve"),
    ("no route to host", "there is no route to its host"),
    ("network is unreachable", "there is no route to its network"),
    ("the database system is starting up", "the server is starting up"),
    ("the database system is shutting down", "the server is shutting down"),
    ("the database system is in recovery mode", "the server is recovering after a crash"),
    ("ssl syscall error", _LOST),
)


def unreachable_why(message: str) -> str:
    """Why a server cannot be reached, in an operator's words, with libpq's own words after them."""
    text = message.lower()
    words = first_line(Exception(message)).removeprefix("connection failed: ")
    for needle, meaning in _UNREACHABLE:
        if needle in text:
            return f"{meaning} [{words}]"
    return words


def server_words(message: str) -> str:
    """The part of libpq's message that is the server's own ("FATAL:  password authentication failed …")."""
    line = message.strip().splitlines()[0] if message.strip() else message
    return line.rsplit(" failed: ", 1)[-1].replace("FATAL:  ", "")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
