"""What a data file holds, told by its content rather than its name.

:func:`sniff` reads the first bytes of a file once and says which reader it
needs:

* ``RECORDIO``: the file starts with a RecordIO chunk header's magic
  (``04 03 02 01``), whatever its name (ElasticDL writes ``data-00000``).
  Records holding serialized ``tf.train.Example`` are RecordIO like any other.
* ``CSV``: text (no NUL or other control bytes) whose rows (as the csv
  module reads them: quoted fields may hold line breaks, a leading UTF-8 byte
  order mark is not data) have one number of fields, two or more. A text file
  named ``*.csv`` is CSV whatever its lines look like (single-column data).
  Text named as documentation (``README``, ``LICENSE``, ``*.md``, ...) is
  never CSV, and :func:`odd_csv_files` picks out, in a set of CSV files,
  those told by content alone whose rows hold another number of fields than
  the set's (a note such as ``this is my dataset, 100 rows``).
* ``PARQUET``: the file starts with the Parquet magic ``PAR1`` and ends with
  it (the footer), whatever its name. A file starting with ``PAR1`` that is
  not text is Parquet too, damaged or cut short: the Parquet reader names
  what is wrong with it rather than calling it an unknown file.
* ``EMPTY``: a 0-byte file, zero records of any format.

The name settles only what the content alone cannot: a ``*.rio`` or
``*.recordio`` file that is not text is read as RecordIO, so damage at its
first chunk is reported as a corrupt RecordIO file (with the byte offset)
rather than as an unknown one. Anything else raises :class:`NotDataError`
with the reason: a binary file of no known format (a TFRecord file and a
gzip-compressed one are named as such), text that is not CSV, a dangling
symbolic link, a directory, a FIFO or device, or a file that cannot be read.
"""

from __future__ import annotations

import csv
import io
import os
import stat
import struct

from flextrain.data.errors import DataError

__all__ = ["RECORDIO", "CSV", "PARQUET", "EMPTY", "FORMATS", "NotDataError", "sniff", "HINT_EXTENSIONS",
           "GZIP_MAGIC", "gzip_reason", "odd_csv_files"]

RECORDIO = "RecordIO"
CSV = "CSV"
PARQUET = "Parquet"
EMPTY = "empty"
#: The formats flextrain reads, for messages ("not RecordIO, CSV or Parquet data").
FORMATS = "RecordIO, CSV or Parquet"

_SAMPLE = 64 * 1024  # bytes read to classify a file
_RECORDIO_MAGIC = struct.pack("<I", 0x01020304)
_RECORDIO_EXTENSIONS = (".rio", ".recordio")
_PARQUET_MAGIC = b"PAR1"
GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark, which Excel writes first in its CSV exports
# Names of text that is documentation, never data, whatever commas it holds.
_DOC_NAMES = ("readme", "license", "licence", "notice", "copying", "changelog", "authors")
_DOC_EXTENSIONS = (".md", ".markdown", ".rst")
#: Extensions that settle what content cannot (see the module docstring).
HINT_EXTENSIONS: tuple[str, ...] = (".csv", ".recordio", ".rio")
# Bytes a text file may hold: printable ASCII and above, tab, newlines, form feed, escape.
_TEXT_BYTES = bytes(range(0x20, 0x100)) + b"\t\n\r\f\v\x1b"


class NotDataError(DataError):
    """A file that is not data flextrain can read; ``reason`` says what it is."""

    def __init__(self, path: str | os.PathLike[str], reason: str):
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path} is not a data file: {reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


def _stat(path: str) -> os.stat_result:
    try:
        return os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            target = os.readlink(path)
            raise NotDataError(path, f"a dangling symbolic link to {target}") from None
        raise NotDataError(path, "no such file") from None
    except OSError as exc:
        raise NotDataError(path, f"cannot be read ({exc.strerror})") from None


def _special(mode: int) -> str | None:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return None
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return f"{name}, not a regular file"
    return "not a regular file"


def sniff(path: str | os.PathLike[str]) -> str:
    """``RECORDIO``, ``CSV``, ``PARQUET`` or ``EMPTY`` for the file ``path``; raises NotDataError otherwise."""
    path = os.fspath(path)
    st = _stat(path)
    special = _special(st.st_mode)
    if special:
        raise NotDataError(path, special)
    try:
        with open(path, "rb") as f:
            head = f.read(_SAMPLE)
    except OSError as exc:
        raise NotDataError(path, f"cannot be read ({exc.strerror})") from None
    if not head:
        return EMPTY
    ext = os.path.splitext(path)[1].lower()
    if head.startswith(_RECORDIO_MAGIC):
        return RECORDIO
    if head.startswith(GZIP_MAGIC):
        raise NotDataError(path, gzip_reason(path))
    parquet = head.startswith(_PARQUET_MAGIC)
    if parquet and _tail(path, st.st_size, head) == _PARQUET_MAGIC:
        return PARQUET
    if not head.translate(None, _TEXT_BYTES):  # nothing but text bytes
        if _is_documentation(path):
            raise NotDataError(path, "text named as documentation, not data")
        if ext == ".csv" or _csv_width(head, whole=len(head) == st.st_size):
            return CSV
        if ext not in _RECORDIO_EXTENSIONS:
            raise NotDataError(path, "text that is not CSV (its lines do not all hold one number of comma-"
                                     "separated fields, 2 or more: name a single-column CSV file *.csv)")
    if ext in _RECORDIO_EXTENSIONS:
        return RECORDIO  # the reader names what is wrong with the first chunk
    if parquet:
        return PARQUET  # no footer: cut short or damaged, which the reader names
    if _looks_like_tfrecord(head):
        raise NotDataError(path, "a TFRecord file, and flextrain reads RecordIO (rewrite the records with "
                                 "flextrain.data.write_records)")
    raise NotDataError(path, f"binary, and not RecordIO or Parquet (its first bytes are {head[:4].hex(' ')}, not "
                             "the RecordIO chunk magic 04 03 02 01 or the Parquet magic PAR1)")


def _tail(path: str, size: int, head: bytes) -> bytes:
    """The last 4 bytes of the file (from ``head`` when it holds the whole file)."""
    if len(head) == size:
        return head[-4:]
    try:
        with open(path, "rb") as f:
            f.seek(size - 4)
            return f.read(4)
    except OSError:
        return b""


def gzip_reason(path: str) -> str:
    """Why a file starting with the gzip magic is not read, and what to do."""
    base, ext = os.path.splitext(path)
    plain = base if ext == ".gz" else f"{base}-plain{ext}"
    return (f"gzip-compressed (its first bytes are the gzip magic 1f 8b): decompress it first "
            f"(gunzip -c {path} > {plain})")


def _is_documentation(path: str) -> bool:
    name = os.path.basename(path).lower()
    return name.split(".")[0] in _DOC_NAMES or os.path.splitext(name)[1] in _DOC_EXTENSIONS


def _csv_width(head: bytes, *, whole: bool) -> int | None:
    """The one number (2 or more) of fields in the rows of ``head``, or None."""
    return _csv_shape(head, whole=whole)[0]


def _csv_shape(head: bytes, *, whole: bool) -> tuple[int | None, int]:
    """``(width, rows)``: the one number (2 or more) of fields in the rows of ``head`` (else None), and
    how many rows it holds.

    Rows as ``CSVReader`` and ``flextrain data convert`` read them (the csv module's: a quoted field may
    hold line breaks, lone ``\\r`` ends a line); latin-1 maps each byte to a character, whatever the encoding.
    """
    text = head.removeprefix(_BOM).decode("latin-1")
    try:
        rows = [row for row in csv.reader(io.StringIO(text, newline="")) if row]
    except csv.Error:
        return None, 0
    if not whole:
        rows = rows[:-1]  # cut by the sample
    widths = {len(row) for row in rows}
    return (widths.pop() if len(widths) == 1 and min(widths) >= 2 else None), len(rows)


def odd_csv_files(files: list[str]) -> list[tuple[str, str]]:
    """``(file, reason)`` for each CSV file told by content alone (not named ``*.csv``) whose rows hold
    another number of fields than the set's CSV data: that of the files named ``*.csv`` if any, else
    the number most rows hold (in each file's first 64 KiB; a tie settles nothing). A stray note such
    as ``this is my dataset, 100 rows`` beside CSV shards is such a file."""
    shapes = {}
    for path in files:
        try:
            with open(path, "rb") as f:
                head = f.read(_SAMPLE)
                shapes[path] = _csv_shape(head, whole=not f.read(1))
        except OSError:
            shapes[path] = (None, 0)
    named = [p for p in files if p.lower().endswith(".csv")]
    votes: dict[int, int] = {}
    for p in named or files:
        width, rows = shapes[p]
        if width is not None:
            votes[width] = votes.get(width, 0) + (1 if named else rows)
    ranked = sorted(votes.items(), key=lambda item: -item[1])
    if not ranked or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
        return []
    width = ranked[0][0]
    example = next(p for p in named or files if shapes[p][0] == width)
    return [(p, f"text whose rows hold {shapes[p][0]} comma-separated fields where the set's CSV data holds "
                f"{width} (as {example}): not taken for CSV (name it *.csv if it is)")
            for p in files if p not in named and shapes[p][0] not in (None, width)]


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def _looks_like_tfrecord(head: bytes) -> bool:
    """A TFRecord file starts with a uint64 length and the masked CRC-32C of those 8 bytes."""
    if len(head) < 12:
        return False
    crc = _crc32c(head[:8])
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    return struct.unpack_from("<I", head, 8)[0] == masked
