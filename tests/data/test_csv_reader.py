"""CSVReader: line indexing and ranged reads."""

from __future__ import annotations

import pytest

from flextrain.data import csv as csv_module
from flextrain.data.csv import CSVReader

LINES = [b"a,1", b"b,2", b"", b"c,3", b"d,4 with spaces", b"e,5"]


def _write(tmp_path, data: bytes, name="f.csv"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
@pytest.mark.parametrize("trailing", [True, False])
def test_lines_and_ranges(tmp_path, newline, trailing):
    data = newline.join(LINES) + (newline if trailing else b"")
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
    assert list(reader.read(5, 6)) == [b"e,5"]
    assert CSVReader(reader.path).num_records == len(LINES) + 1  # header=False keeps it


@pytest.mark.parametrize(
    "data,header,expected",
    [
        (b"", False, []),
        (b"", True, []),
        (b"only-header\n", True, []),
        (b"only-header", True, []),
        (b"x", False, [b"x"]),
        (b"\n", False, [b""]),
        (b"a\n\n", False, [b"a", b""]),  # only the final empty line is dropped
        (b"a\r\nb", False, [b"a", b"b"]),
        (b"a\rb\n", False, [b"a\rb"]),  # a bare CR is not a line break
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
