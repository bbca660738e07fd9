"""Parquet files as a data source: the reader, sniffing by content, shards and ranged reads."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rio_refdata import MULTI_RECORDS

from flextrain.data import (
    DataError,
    DataOptions,
    ParquetReader,
    Shard,
    list_data_files,
    make_shards,
    open_reader,
    read_shard_range,
    write_records,
)
from flextrain.data import sources
from flextrain.data.formats import PARQUET, RECORDIO, sniff


def table(n: int, offset: int = 0) -> pa.Table:
    ids = np.arange(offset, offset + n)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "x16": pa.array(ids.astype(np.float16) / 4, pa.float16()),
        "x32": pa.array(ids.astype(np.float32) / 3, pa.float32()),
        "x64": pa.array(ids / 7.0, pa.float64()),
        "name": pa.array([None if i % 5 == 0 else f"row-{i}" for i in ids], pa.string()),
        "pixels": pa.array([[float(i), float(i) + 0.5] for i in ids], pa.list_(pa.float32())),
    })


def write(path, n: int, row_group_size: int, offset: int = 0):
    pq.write_table(table(n, offset), path, row_group_size=row_group_size)
    return path


@pytest.fixture
def reads(monkeypatch):
    """Every ``read_row_groups`` call: (row groups, columns)."""
    calls = []
    original = pq.ParquetFile.read_row_groups

    def spy(self, row_groups, columns=None, **kw):
        calls.append((list(row_groups), None if columns is None else list(columns)))
        return original(self, row_groups, columns=columns, **kw)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", spy)
    return calls


def test_reader_row_groups_and_columns(tmp_path):
    reader = ParquetReader(write(tmp_path / "a.parquet", 25, 10))
    assert reader.num_records == len(reader) == 25
    assert reader.row_groups == [(0, 10), (10, 20), (20, 25)]
    assert reader.columns == ["id", "x16", "x32", "x64", "name", "pixels"]
    assert reader.path == str(tmp_path / "a.parquet")


def test_ranges_crossing_row_groups_read_only_the_overlapping_ones(tmp_path, reads):
    reader = ParquetReader(write(tmp_path / "a.parquet", 25, 10))
    rows = reader.records(8, 22)
    assert [r["id"] for r in rows] == list(range(8, 22))
    assert reads == [([0, 1, 2], None)]
    reads.clear()
    assert [r["id"] for r in reader.records(10, 20)] == list(range(10, 20))
    assert [r["id"] for r in reader.records(19, 21)] == [19, 20]
    assert [r["id"] for r in reader.records(24, 25)] == [24]
    assert reader.records(5, 5) == []
    assert reads == [([1], None), ([1, 2], None), ([2], None)]
    assert [r["id"] for r in reader.records(0, 25)] == list(range(25))
    with pytest.raises(ValueError, match=r"\[20, 26\) out of bounds for .*a\.parquet which has 25 records"):
        reader.records(20, 26)


def test_projection_reads_only_the_requested_columns(tmp_path, reads):
    reader = ParquetReader(write(tmp_path / "a.parquet", 25, 10))
    rows = reader.records(3, 12, columns=["pixels", "id"])
    assert reads == [([0, 1], ["pixels", "id"])]
    assert [list(r) for r in rows] == [["pixels", "id"]] * 9  # the columns asked for, in that order
    assert rows[0] == {"pixels": [3.0, 3.5], "id": 3}


def test_values_nulls_lists_and_float_widths(tmp_path):
    path = write(tmp_path / "a.parquet", 12, 5)
    assert pq.read_schema(path).field("x16").type == pa.float16()  # stored as half floats
    rows = ParquetReader(path).records(0, 12)
    for i, row in enumerate(rows):
        assert row["id"] == i and isinstance(row["id"], int)
        assert row["x16"] == float(np.float16(i) / np.float16(4))
        assert row["x32"] == float(np.float32(i) / np.float32(3))  # the float32 value, exactly
        assert row["x64"] == i / 7.0
        assert row["pixels"] == [float(i), float(i) + 0.5] and isinstance(row["pixels"], list)
        assert row["name"] == (None if i % 5 == 0 else f"row-{i}")
    assert [r["name"] for r in rows].count(None) == 3


def test_sniffed_by_content_whatever_the_name(tmp_path):
    path = write(tmp_path / "data-00000", 30, 8)  # ElasticDL-style name, no extension
    assert sniff(path) == PARQUET
    assert isinstance(open_reader(path), ParquetReader)
    assert make_shards(path) == [Shard(str(path), 0, 8), Shard(str(path), 8, 16), Shard(str(path), 16, 24),
                                 Shard(str(path), 24, 30)]
    assert [r["id"] for r in read_shard_range(path, 6, 10)] == [6, 7, 8, 9]
    cut = tmp_path / "cut"  # PAR1 at the start but no footer: Parquet cut short, named by the reader
    cut.write_bytes(path.read_bytes()[:200])
    assert sniff(cut) == PARQUET


def test_make_shards_one_per_row_group_and_big_ones_split(tmp_path, monkeypatch):
    path = write(tmp_path / "a.parquet", 25, 10)
    assert make_shards(path) == [Shard(str(path), 0, 10), Shard(str(path), 10, 20), Shard(str(path), 20, 25)]
    monkeypatch.setattr(sources, "PARQUET_SHARD_ROWS", 4)
    assert [(s.start, s.end) for s in make_shards(path)] == [(0, 4), (4, 8), (8, 10), (10, 14), (14, 18),
                                                             (18, 20), (20, 24), (24, 25)]


def test_several_files_a_directory_and_globs(tmp_path):
    d = tmp_path / "train"
    d.mkdir()
    write(d / "part-1.parquet", 7, 4, offset=20)
    write(d / "part-0.parquet", 20, 10)
    pq.write_table(table(0), d / "part-2.parquet")  # no rows: no shard
    shards = make_shards(d)
    assert [(s.source.rsplit("/", 1)[1], s.start, s.end) for s in shards] == [
        ("part-0.parquet", 0, 10), ("part-0.parquet", 10, 20), ("part-1.parquet", 0, 4), ("part-1.parquet", 4, 7)]
    ids = [r["id"] for s in shards for r in read_shard_range(s.source, s.start, s.end)]
    assert ids == list(range(27))
    assert make_shards(f"{d}/part-*") == shards
    assert make_shards(f"{d / 'part-1.parquet'},{d / 'part-0.parquet'}")[0].source == str(d / "part-1.parquet")
    assert len(list_data_files(d)) == 3


def test_mixing_with_recordio_is_refused(tmp_path):
    write(tmp_path / "b.parquet", 5, 5)
    write_records(tmp_path / "a.rio", MULTI_RECORDS[:3])
    assert sniff(tmp_path / "a.rio") == RECORDIO
    with pytest.raises(DataError, match=f"^training data {tmp_path} mixes RecordIO and Parquet files "
                                        rf"\({tmp_path / 'a.rio'} is RecordIO, {tmp_path / 'b.parquet'} is Parquet\): "
                                        "one data path must hold one format"):
        make_shards(tmp_path, what="training data")


def test_read_shard_range_with_and_without_columns(tmp_path, reads):
    path = write(tmp_path / "a.parquet", 25, 10)
    full = read_shard_range(path, 9, 11)
    assert [set(r) for r in full] == [{"id", "x16", "x32", "x64", "name", "pixels"}] * 2
    assert read_shard_range(path, 9, 11, columns=["id"]) == [{"id": 9}, {"id": 10}]
    assert read_shard_range(path, 9, 11, columns=("id", "id")) == [{"id": 9}, {"id": 10}]
    assert reads[-1] == ([0, 1], ["id"])
    # other formats have no columns: the argument is ignored
    write_records(tmp_path / "r.rio", MULTI_RECORDS[:4])
    assert read_shard_range(tmp_path / "r.rio", 1, 3, columns=["id"]) == MULTI_RECORDS[1:3]


def test_missing_columns_are_named(tmp_path):
    path = write(tmp_path / "a.parquet", 5, 5)
    with pytest.raises(DataError) as info:
        read_shard_range(path, 0, 2, columns=["id", "label", "image"])
    assert str(info.value) == (f"Parquet file {path} has no columns 'label', 'image' (its columns: 'id', 'x16', "
                               "'x32', 'x64', 'name', 'pixels')")
    with pytest.raises(DataError, match=f"^Parquet file {path} has no column 'label' "):
        ParquetReader(path).records(0, 1, columns=["label"])


def test_make_shards_checks_the_columns_of_every_file(tmp_path):
    d = tmp_path / "train"
    d.mkdir()
    write(d / "a.parquet", 5, 5)
    pq.write_table(table(5).drop_columns(["pixels"]), d / "b.parquet")
    assert DataOptions.of(object()).columns is None
    options = DataOptions(columns=["id", "x32"])
    assert options.columns == ("id", "x32")
    assert len(make_shards(d, options=options)) == 2
    with pytest.raises(DataError) as info:
        make_shards(d, options=DataOptions(columns=("pixels", "id")), what="training data")
    assert str(info.value).startswith(f"Parquet file {d / 'b.parquet'} has no column 'pixels' (its columns: 'id',")

    class Spec:
        columns = ["pixels"]

    assert DataOptions.of(Spec).columns == ("pixels",)
    with pytest.raises(DataError, match="has no column 'pixels'"):
        make_shards(d, options=DataOptions.of(Spec))


def test_truncated_file_is_named(tmp_path):
    good = write(tmp_path / "a.parquet", 100, 10)
    cut = tmp_path / "data-00001"
    cut.write_bytes(good.read_bytes()[:-100])
    for call in (lambda: make_shards(cut, what="training data"), lambda: read_shard_range(cut, 0, 1)):
        with pytest.raises(DataError) as info:
            call()
        message = str(info.value)
        assert message.startswith(f"damaged Parquet file {cut}: ") and "magic bytes not found" in message, message
    err = info.value
    assert str(pickle.loads(pickle.dumps(err))) == str(err)  # errors cross process boundaries


def test_damaged_pages_are_named_with_the_rows(tmp_path):
    path = write(tmp_path / "a.parquet", 1000, 250)
    meta = pq.read_metadata(path)
    column = meta.row_group(2).column(0)  # "id" of row group 2
    data = bytearray(path.read_bytes())
    lo = column.data_page_offset
    data[lo:lo + column.total_compressed_size] = b"\xff" * column.total_compressed_size
    path.write_bytes(bytes(data))
    reader = ParquetReader(path)  # the footer is intact
    assert [r["id"] for r in reader.records(0, 3, columns=["id"])] == [0, 1, 2]  # other row groups still read
    with pytest.raises(DataError) as info:
        reader.records(600, 601, columns=["id"])
    assert str(info.value).startswith(f"damaged Parquet file {path} (rows [600, 601), row groups 2..2): ")
