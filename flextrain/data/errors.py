"""Exceptions raised by the flextrain data layer.

Contract: every message names the file (or directory) involved and, when it
is meaningful, the byte offset, line or record. A user looking at a failed
job must be able to find the bad input from the message alone.
"""

from __future__ import annotations

import os

__all__ = ["DataError", "CorruptRecordIOError"]


class DataError(ValueError):
    """Base class for all data-layer errors (bad paths, formats, records).

    Subclasses ValueError so callers that validate user input generically
    (``except ValueError``) also catch data problems.
    """


class CorruptRecordIOError(DataError):
    """A RecordIO file is structurally damaged.

    Attributes:
        path: the file, as given to the reader.
        offset: byte offset of the chunk header of the damaged chunk (or of
            the truncated/garbled header itself). This is the offset a Go
            ``LoadIndex`` walk would have reached, so it can be checked with
            a hex dump.
    """

    def __init__(self, path: str | os.PathLike[str], offset: int, reason: str):
        self.path = os.fspath(path)
        self.offset = offset
        self.reason = reason
        super().__init__(f"corrupt RecordIO file {self.path}: chunk at byte offset {offset}: {reason}")

    def __reduce__(self):
        # Default exception pickling replays ``args`` (the formatted message)
        # into __init__, which has a different signature; errors cross process
        # boundaries (worker pools), so keep them picklable.
        return (type(self), (self.path, self.offset, self.reason))
