"""Training and `flextrain data convert` agree on what a CSV record is; files that are no CSV data are named.

Training's records (``make_shards`` + ``read_shard_range``, what ``feed`` gets and the job counts) must be the
rows convert writes: blank lines, quoted line breaks, old-Mac line ends and Excel's byte order mark included.
"""

from __future__ import annotations

import csv
import gzip
import io

import pytest

from flextrain.data import DataOptions, make_shards, read_shard_range
from flextrain.data.convert import ConvertOptions, convert
from flextrain.data.convert.csvsplit import plan_csv
from flextrain.data.errors import DataError
from flextrain.data.formats import CSV, NotDataError, sniff
from flextrain.data.rows import load_schema
from flextrain.data.sources import clear_reader_cache

BOM = b"\xef\xbb\xbf"

CASES = {
    # name: (file bytes, header, the rows as the csv module reads them)
    "trailing_blank": (b"1,2,3,4,0\n5,6,7,8,1\n\n", False, [["1", "2", "3", "4", "0"], ["5", "6", "7", "8", "1"]]),
    "blank_lines_crlf": (b"\r\n1,2\r\n\r\n3,4\r\n\r\n\r\n5,6\r\n\r\n", False, [["1", "2"], ["3", "4"], ["5", "6"]]),
    "quoted_newline": (b'name,x1,label\n"Smith, J",2.0,0\n"multi\nline",4.0,1\n', True,
                       [["Smith, J", "2.0", "0"], ["multi\nline", "4.0", "1"]]),
    "quoted_crlf_blank": (b'n,s\r\n1,"a\r\n\r\nb"\r\n2,c\r\n', True, [["1", "a\r\n\r\nb"], ["2", "c"]]),
    "bom_header": (BOM + b"x0,x1,label\n1.0,2.0,0\n3.0,4.0,1\n", True, [["1.0", "2.0", "0"], ["3.0", "4.0", "1"]]),
    "bom_no_header": (BOM + b"1.0,2.0,0\n3.0,4.0,1\n", False, [["1.0", "2.0", "0"], ["3.0", "4.0", "1"]]),
    "cr_only": (b"x0,x1,label\r1,2,0\r3,4,1\r", True, [["1", "2", "0"], ["3", "4", "1"]]),
}


@pytest.fixture(autouse=True)
def _fresh_readers():
    clear_reader_cache()
    yield
    clear_reader_cache()


@pytest.mark.parametrize("name", sorted(CASES))
def test_training_records_are_the_rows_convert_writes(tmp_path, name):
    data, header, rows = CASES[name]
    path = tmp_path / f"{name}.csv"
    path.write_bytes(data)
    (tmp_path / name).write_bytes(data)
    assert sniff(path) == CSV and sniff(tmp_path / name) == CSV  # told by content too, without the extension
    shards = make_shards(path, options=DataOptions(csv_header=header))
    records = [r for s in shards for r in read_shard_range(s.source, s.start, s.end)]
    assert sum(s.size for s in shards) == len(records) == len(rows)  # what the job counts is what feed gets
    assert [next(csv.reader(io.StringIO(r.decode(), newline=""))) for r in records] == rows
    assert not any(r.startswith(BOM) for r in records)
    for workers in (1, 2):
        result = tmp_path / f"out{workers}"
        convert(path, result, ConvertOptions(header=header, workers=workers, shard_size=1))
        assert load_schema(result).records == len(records)


def test_a_byte_order_mark_never_reaches_field_names_or_types(tmp_path):
    for data in (BOM + b"x0,x1\n1.5,2\n", BOM + b'"x0",x1\n1.5,2\n'):
        (tmp_path / "h.csv").write_bytes(data)
        convert(tmp_path / "h.csv", tmp_path / "h", ConvertOptions(overwrite=True))  # header detected
        assert [(f.name, f.dtype) for f in load_schema(tmp_path / "h").fields] == [("x0", "float64"), ("x1", "int64")]
    (tmp_path / "n.csv").write_bytes(BOM + b"1.5,2\n3.5,4\n")
    assert plan_csv(str(tmp_path / "n.csv")) is not None  # the workers' path, as for the whole-file one below
    convert(tmp_path / "n.csv", tmp_path / "n", ConvertOptions())
    assert [(f.name, f.dtype) for f in load_schema(tmp_path / "n").fields] == [("c0", "float64"), ("c1", "int64")]
    (tmp_path / "q.csv").write_bytes(BOM + b'1.5,"2"\n3.5,4\n')
    convert(tmp_path / "q.csv", tmp_path / "q", ConvertOptions())
    assert [(f.name, f.dtype) for f in load_schema(tmp_path / "q").fields] == [("c0", "float64"), ("c1", "int64")]


@pytest.mark.parametrize("name", ["plain.csv.gz", "gz_named.csv", "data-00000"])
def test_gzip_files_are_named_as_compressed(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(gzip.compress(b"x0,x1,label\n1,2,0\n"))
    with pytest.raises(NotDataError, match="gzip-compressed .*decompress it first \\(gunzip -c "):
        sniff(path)
    with pytest.raises(DataError, match=f"training data file {path} is not .*: gzip-compressed"):
        make_shards(path, what="training data")
    with pytest.raises(DataError, match=f"source {path} is gzip-compressed .*gunzip -c {path} > "):
        convert(path, tmp_path / "out", ConvertOptions())


def _shards_dir(tmp_path, name: str):
    d = tmp_path / "train"
    d.mkdir()
    (d / name).write_bytes(b"".join(b"0.1,0.2,0.3,0.4,%d\n" % (k % 2) for k in range(100)))
    return d


@pytest.mark.parametrize("data_name", ["part-0.csv", "data-00000"])
def test_a_note_with_a_comma_beside_csv_shards_is_not_data(tmp_path, data_name):
    d = _shards_dir(tmp_path, data_name)
    (d / "README").write_text("this is my dataset, 100 rows\n")
    (d / "notes").write_text("this is my dataset, 100 rows\n")
    (d / "doc.md").write_text("a,b\n")
    with pytest.raises(DataError) as info:
        make_shards(d, what="training data")
    message = str(info.value)
    assert "3 files are not RecordIO, CSV or Parquet data" in message
    assert f"{d / 'README'}: text named as documentation" in message
    assert f"{d / 'doc.md'}: text named as documentation" in message
    assert f"{d / 'notes'}: text whose rows hold 2 comma-separated fields where the set's CSV data holds 5" in message
    skipped = []
    shards = make_shards(d, options=DataOptions(skip_unknown_files=True), skipped=skipped)
    assert [(s.source, s.size) for s in shards] == [(str(d / data_name), 100)]
    assert "skipped 3 files" in skipped[0]


def test_csv_files_of_other_widths_are_kept_where_named_or_without_a_majority(tmp_path):
    d = _shards_dir(tmp_path, "part-0.csv")
    (d / "part-1.csv").write_text("1,2\n3,4\n")  # named *.csv: always CSV
    assert sorted(s.size for s in make_shards(d)) == [2, 100]
    e = tmp_path / "even"
    e.mkdir()
    (e / "a").write_text("1,2\n3,4\n")
    (e / "b").write_text("1,2,3\n4,5,6\n")  # as many rows of each width: nothing to tell a stray file by
    assert sorted(s.size for s in make_shards(e)) == [2, 2]
