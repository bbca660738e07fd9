"""What ``flextrain data convert`` reads: a source's kind, its fields, its rows by range.

:func:`open_source` tells the kind of a path (by extension, else by content)
and returns a :class:`Source`: its fields (name, dtype, shape, inferred from
the data) and ``read(start, end)``, the columns of rows ``[start, end)`` as
:func:`flextrain.data.rows.encode_rows` takes them. Tabular sources are
parsed (and checked) once, when opened; an image folder is listed and each
image's header read when opened, its pixels decoded by ``read``, so pool
workers decode their own shards.
"""

from __future__ import annotations

import os

from flextrain.data.convert.base import Source
from flextrain.data.errors import DataError
from flextrain.data.formats import GZIP_MAGIC, gzip_reason

__all__ = ["KINDS", "Source", "open_source"]

KINDS = ("csv", "npy", "npz", "parquet", "jsonl", "images")
_EXTENSIONS = {".csv": "csv", ".npy": "npy", ".npz": "npz", ".parquet": "parquet", ".pq": "parquet",
               ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}


def open_source(path: str | os.PathLike[str], *, header: bool | None = None, field: str = "x") -> Source:
    """Open ``path`` for conversion; DataError naming the problem (file, line or record, field).

    ``header``: whether a CSV file's first line names its columns (None: detected: a first line
    with no number over a second line with one). ``field``: the field name of a ``.npy`` array.
    """
    path = os.fspath(path)
    kind = source_kind(path)
    if kind == "images":
        from flextrain.data.convert.images import open_images

        return open_images(path)
    from flextrain.data.convert import tabular

    if kind == "csv":
        return tabular.open_csv(path, header=header)
    if kind == "jsonl":
        return tabular.open_jsonl(path)
    if kind == "npy":
        return tabular.open_npy(path, field=field)
    if kind == "npz":
        return tabular.open_npz(path)
    return tabular.open_parquet(path)


def source_kind(path: str) -> str:
    """The kind of ``path``: told by its extension, else by its first bytes, else refused."""
    if not os.path.lexists(path):
        raise DataError(f"source not found: {path}")
    if os.path.isdir(path):
        return _directory_kind(path)
    ext = os.path.splitext(path)[1].lower()
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError as exc:
        raise DataError(f"source {path} cannot be read ({exc.strerror})") from None
    if head.startswith(GZIP_MAGIC):  # whatever its name: data.csv.gz, or a .csv that is gzip'd
        raise DataError(f"source {path} is {gzip_reason(path)}")
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head.startswith(b"PK\x03\x04"):
        return "npz"
    if head.lstrip().startswith(b"{"):
        return "jsonl"
    raise DataError(f"cannot tell the format of {path} (extension {ext or 'none'!r}, first bytes "
                    f"{head[:8].hex(' ') or 'none: it is empty'}): name it .csv, .npy, .npz, .parquet or .jsonl, "
                    "or give a directory of class sub-folders of images or of Parquet files")


def _directory_kind(path: str) -> str:
    names = sorted(n for n in os.listdir(path) if not n.startswith("."))
    dirs = [n for n in names if os.path.isdir(os.path.join(path, n))]
    files = [n for n in names if n not in dirs]
    if dirs and not files:
        return "images"
    if files and not dirs and all(_is_parquet(os.path.join(path, n)) for n in files):
        return "parquet"
    if not names:
        raise DataError(f"source directory {path} is empty")
    raise DataError(f"cannot tell the format of directory {path}: it is neither an image folder (only class "
                    f"sub-folders) nor a directory of Parquet files (it holds {len(dirs)} sub-folder(s) and "
                    f"{len(files)} file(s), e.g. {(files or dirs)[0]})")


def _is_parquet(path: str) -> bool:
    if path.lower().endswith((".parquet", ".pq")):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PAR1"
    except OSError:
        return False
