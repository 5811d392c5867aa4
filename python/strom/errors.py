"""Strom exceptions.

Every error raised by Strom is a :class:`StromError` carrying the stable
numeric ``code`` shared by the Rust, C and Python interfaces, and its name
``code_name`` (for example ``400`` / ``"INVALID_METADATA"``). Codes are listed
in ``docs/protocol.md``; a retired code is never reused.
"""

from __future__ import annotations

import builtins

__all__ = [
    "StromError",
    "TimeoutError",
    "TopicNotFound",
    "TopicExists",
    "TopicClosed",
    "InvalidMetadata",
    "InvalidArgument",
    "ConnectionError",
    "DataError",
    "ForkError",
    "PartitionUnavailable",
    "DataDirLocked",
    "GroupFileLive",
    "DataCorrupt",
    "DataExpired",
    "PartitionFailed",
    "NotAuthorized",
    "Unauthenticated",
]


class StromError(Exception):
    """Base class of every Strom error.

    Attributes:
        code: the stable numeric error code (``int``).
        code_name: the code's name, such as ``"TOPIC_NOT_FOUND"``.
    """

    code: int = 1
    code_name: str = "INTERNAL"

    def __init__(self, message: str, code: int | None = None, code_name: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code
        if code_name is not None:
            self.code_name = code_name

    def __str__(self) -> str:
        message = str(self.args[0]) if self.args else ""
        suffix = f"[{self.code_name} ({self.code})]"
        return message if message.endswith(suffix) else f"{message} {suffix}"


class TimeoutError(StromError, builtins.TimeoutError):  # noqa: A001 - mirrors the builtin
    """A wait ran out of time (code 502, ``TIMEOUT``). Also a builtin ``TimeoutError``."""


class TopicNotFound(StromError, LookupError):
    """No topic with that name (code 200)."""


class TopicExists(StromError):
    """A topic with that name already exists (code 201)."""


class TopicClosed(StromError):
    """The topic's stream has ended; nothing more can be produced (code 204)."""


class PartitionUnavailable(StromError):
    """The member hosting a partition is down, or the partition could not be
    opened (code 207, ``PARTITION_UNAVAILABLE``)."""

    code = 207
    code_name = "PARTITION_UNAVAILABLE"


class DataDirLocked(StromError):
    """Another server process holds the data directory (code 208,
    ``DATA_DIR_LOCKED``): for example two ``Driver.embedded`` on one path."""

    code = 208
    code_name = "DATA_DIR_LOCKED"


class GroupFileLive(StromError):
    """The group file names live members of another group (code 209,
    ``GROUP_FILE_LIVE``)."""

    code = 209
    code_name = "GROUP_FILE_LIVE"


class DataCorrupt(StromError):
    """A range of offsets is unreadable (damaged on disk) and was quarantined
    (code 309, ``DATA_CORRUPT``)."""

    code = 309
    code_name = "DATA_CORRUPT"


class DataExpired(StromError):
    """Events were dropped by the overflow policy before this reader got them
    (code 310, ``DATA_EXPIRED``)."""

    code = 310
    code_name = "DATA_EXPIRED"


class PartitionFailed(StromError):
    """The partition stopped after a failed fsync or write and must be
    reopened (code 311, ``PARTITION_FAILED``)."""

    code = 311
    code_name = "PARTITION_FAILED"


class InvalidMetadata(StromError, ValueError):
    """Metadata rejected by the topic's validator (code 400)."""


class InvalidArgument(StromError, ValueError):
    """An argument is invalid (code 504)."""


class ConnectionError(StromError, builtins.ConnectionError):  # noqa: A001
    """Could not connect to a server, or the connection was lost (codes 500, 501)."""


class DataError(StromError):
    """A data selector or broker failed (codes 600, 601); ``__cause__`` holds
    the exception a Python selector or broker raised, if any."""


class NotAuthorized(StromError, PermissionError):
    """The connection's principal may not do this to this resource (ACLs,
    or its token's scope); the message names all three (docs/security.md)."""

    code = 106
    code_name = "NOT_AUTHORIZED"


class Unauthenticated(StromError, PermissionError):
    """The server refused the token: malformed, expired, revoked or signed
    for another group (docs/security.md)."""

    code = 105
    code_name = "UNAUTHENTICATED"


class ForkError(StromError, RuntimeError):
    """A Strom object made before ``fork()`` was used in the child process.

    Strom's background threads do not survive ``fork()``: create the
    ``Driver`` in the child after forking, or use the ``spawn`` /
    ``forkserver`` start methods.
    """
