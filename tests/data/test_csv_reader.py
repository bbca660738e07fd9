"""CSVReader: row indexing (as the csv module splits rows) and ranged reads."""

from __future__ import annotations

import csv as stdlib_csv
import io
import random

import numpy as np
import pytest

from flextrain.data import csv as csv_module
from flextrain.data.csv import CSVReader

LINES = [b"a,1", b"b,2", b"c,3", b"d,4 with spaces", b"e,5"]


def _write(tmp_path, data: bytes, name="f.csv"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
@pytest.mark.parametrize("trailing", [True, False])
def test_lines_and_ranges(tmp_path, newline, trailing):
    data = newline.join(LINES[:2] + [b""] + LINES[2:]) + (newline if trailing else b"")  # a blank line: no record
    reader = CSVReader(_write(tmp_path, data))
    assert reader.num_records == len(reader) == len(LINES)
    assert list(reader) == LINES
    n = len(LINES)
    for start in range(n + 1):
        for end in range(start, n + 1):
            assert list(reader.read(start, end)) == LINES[start:end], (start, end)


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
def test_header_is_skipped(tmp_path, newline):
    data = newline.join([b"name,value", *LINES]) + newline
    reader = CSVReader(_write(tmp_path, data), header=True)
    assert reader.header and reader.num_records == len(LINES)
    assert list(reader.read(0, 2)) == LINES[:2]
    assert list(reader.read(4, 5)) == [b"e,5"]
    assert CSVReader(reader.path).num_records == len(LINES) + 1  # header=False keeps it


@pytest.mark.parametrize(
    "data,header,expected",
    [
        (b"", False, []),
        (b"", True, []),
        (b"only-header\n", True, []),
        (b"only-header", True, []),
        (b"x", False, [b"x"]),
        (b"\n", False, []),
        (b"\n\nonly-header\n\n", True, []),
        (b"a\n\n", False, [b"a"]),  # blank lines are no records, anywhere
        (b"\n\r\na\n\n\nb\r\n\r\n", False, [b"a", b"b"]),
        (b"a\r\nb", False, [b"a", b"b"]),
        (b"a\rb\r", False, [b"a", b"b"]),  # old Mac line ends, as the csv module reads them
        (b"a\r\rb", False, [b"a", b"b"]),
        (b"\xef\xbb\xbfx,y\n1,2\n", False, [b"x,y", b"1,2"]),  # an Excel export's byte order mark
        (b"\xef\xbb\xbfx,y\n1,2\n", True, [b"1,2"]),
        (b"\xef\xbb\xbf\n", False, []),
        (b'n,x\n"Smith, J",2.0\n"multi\nline",4.0\n', True, [b'"Smith, J",2.0', b'"multi\nline",4.0']),
        (b'"a\r\n\r\nb",1\r\n"",2', False, [b'"a\r\n\r\nb",1', b'"",2']),  # a quoted blank line is data
        (b'"say ""hi\n""",1\n2,3\n', False, [b'"say ""hi\n""",1', b"2,3"]),
        (b'5" tall,1\n6" wide,2\n', False, [b'5" tall,1', b'6" wide,2']),  # quotes inside a field: literal
        (b'"open,1\n2,3\n', False, [b'"open,1\n2,3\n']),  # left open: to the end, as the csv module
    ],
)
def test_edge_cases(tmp_path, data, header, expected):
    reader = CSVReader(_write(tmp_path, data), header=header)
    assert reader.num_records == len(expected)
    assert list(reader) == expected


def test_index_spans_many_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(csv_module, "_BLOCK", 7)  # force lines across block edges
    lines = [b"%d,%s" % (i, b"v" * (i % 13)) for i in range(500)]
    reader = CSVReader(_write(tmp_path, b"\r\n".join(lines) + b"\r\n"))
    assert reader.num_records == 500
    assert list(reader.read(123, 131)) == lines[123:131]
    assert list(reader) == lines


def test_read_seeks_without_rescanning(tmp_path, monkeypatch):
    lines = [b"row-%d" % i for i in range(1000)]
    reader = CSVReader(_write(tmp_path, b"\n".join(lines)))
    monkeypatch.setattr(CSVReader, "_index", lambda self: pytest.fail("re-indexed on read"))
    reads = []
    real_open = open

    class SpyFile:
        def __init__(self, f):
            self._f = f

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self._f.close()

        def seek(self, pos):
            return self._f.seek(pos)

        def read(self, n=-1):
            reads.append(n)
            return self._f.read(n)

    monkeypatch.setattr(csv_module, "open", lambda p, m: SpyFile(real_open(p, m)), raising=False)
    assert list(reader.read(500, 503)) == lines[500:503]
    assert reads == [len(b"row-500\nrow-501\nrow-502")]  # only the requested bytes


@pytest.mark.parametrize("start,end", [(-1, 1), (0, 7), (3, 2)])
def test_out_of_range(tmp_path, start, end):
    path = _write(tmp_path, b"\n".join(LINES))
    with pytest.raises(ValueError, match="out of bounds") as info:
        CSVReader(path).read(start, end)
    assert str(path) in str(info.value)


def _rows_of(data: bytes) -> list[list[str]]:
    """The rows Python's csv module reads (what ``flextrain data convert`` parses), blank lines left out."""
    text = data.decode("latin-1").removeprefix("\xef\xbb\xbf")
    return [row for row in stdlib_csv.reader(io.StringIO(text, newline="")) if row]


@pytest.mark.parametrize("block", [2, 1 << 20])
def test_records_are_the_csv_modules_rows(tmp_path, monkeypatch, block):
    """Random text of quotes, separators and every line end: each record parses to the csv module's row."""
    monkeypatch.setattr(csv_module, "_BLOCK", block)  # quotes and CRLFs across block edges
    pieces = [b"a", b"1", b",", b"\n", b"\r", b"\r\n", b'"', b'""', b" ", "é".encode(), b',"', b'",', b'"\n']
    rng = random.Random(block)
    fast = 0
    for i in range(600):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        data = (b"\xef\xbb\xbf" if i % 10 == 0 else b"") + data
        reader = CSVReader(_write(tmp_path, data))
        records = list(reader)
        assert [next(stdlib_csv.reader(io.StringIO(r.decode("latin-1"), newline=""))) for r in records] \
            == _rows_of(data), data
        fast += csv_module._rows(np.frombuffer(data, np.uint8)) is not None
    assert fast > 60  # the numpy path, not only the csv module's fallback, was checked


def test_unparseable_quote_placement_falls_back_to_the_csv_module(tmp_path, monkeypatch):
    calls = []
    real = csv_module._rows_by_csv_module
    monkeypatch.setattr(csv_module, "_rows_by_csv_module", lambda path, data: calls.append(path) or real(path, data))
    assert list(CSVReader(_write(tmp_path, b'"a\nb",1\n2,3\n'))) == [b'"a\nb",1', b"2,3"]
    assert not calls  # well-placed quotes: numpy alone
    assert list(CSVReader(_write(tmp_path, b'x"y,1\n2,3\n'))) == [b'x"y,1', b"2,3"]
    assert len(calls) == 1
