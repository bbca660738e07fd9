"""flextrain.data.sources: file discovery, sharding, cached readers."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pytest
from rio_refdata import MULTI_RECORDS, TESTDATA

from flextrain.data import (
    SUPPORTED_EXTENSIONS,
    CSVReader,
    DataError,
    RecordIOReader,
    Shard,
    list_data_files,
    make_shards,
    open_reader,
    read_shard_range,
    write_records,
)


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "train"
    d.mkdir()
    write_records(d / "b-part.rio", MULTI_RECORDS[:30], max_chunk_size=500)
    write_records(d / "a-part.recordio", MULTI_RECORDS[30:40])
    (tmp_path / "c.csv").write_bytes(b"1,2\n3,4\n5,6\n")  # beside: one data path holds one format
    shutil.copyfile(TESTDATA / "zero_records.rio", d / "d-empty.rio")
    (d / ".hidden.rio").write_bytes(b"garbage")  # dot-files are passed over
    (d / "sub.rio").mkdir()  # a directory, even with a data extension, is skipped
    return d


def test_shard():
    shard = Shard("/d/a.rio", 3, 10)
    assert shard.size == 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        shard.start = 0
    with pytest.raises(ValueError):
        Shard("/d/a.rio", 5, 4)
    with pytest.raises(ValueError):
        Shard("/d/a.rio", -1, 4)


def test_list_data_files(data_dir):
    names = [os.path.basename(p) for p in list_data_files(data_dir)]
    assert names == ["a-part.recordio", "b-part.rio", "d-empty.rio"]
    assert all(os.path.dirname(p) == str(data_dir) for p in list_data_files(data_dir))
    single = data_dir.parent / "c.csv"
    assert list_data_files(single) == [str(single)]


def test_a_glob_reads_the_files_of_the_directories_it_matches(tmp_path):
    for day in ("day-1", "day-2"):
        (tmp_path / day).mkdir()
        write_records(tmp_path / day / "part-0.rio", MULTI_RECORDS[:5])
        (tmp_path / day / "schema.json").write_text("{}")  # a converted directory's schema: passed over
    write_records(tmp_path / "day-3.rio", MULTI_RECORDS[:5])  # a file among the matches: itself
    (tmp_path / "day-4").mkdir()
    (tmp_path / "day-4" / "nested").mkdir()  # a directory's subdirectories stay passed over
    files = list_data_files(str(tmp_path / "day-*"))
    assert files == [str(tmp_path / "day-1" / "part-0.rio"), str(tmp_path / "day-2" / "part-0.rio"),
                     str(tmp_path / "day-3.rio")]
    assert list_data_files(f"{tmp_path / 'day-1'},{tmp_path / 'day-2'}") == files[:2]  # as the list of matches


def test_missing_directory(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(DataError) as info:
        list_data_files(missing, what="training data")
    assert str(info.value) == f"training data directory not found: {missing}"
    with pytest.raises(DataError, match=r"^data file not found: .*x\.rio$"):
        make_shards(tmp_path / "x.rio")


def test_empty_directory(tmp_path):
    (tmp_path / ".hidden").write_text("passed over")
    with pytest.raises(DataError) as info:
        make_shards(tmp_path, what="validation data")
    assert str(info.value).startswith(f"validation data directory {tmp_path} contains no data files")
    (tmp_path / "readme.md").write_text("no data here")  # not skipped in silence
    with pytest.raises(DataError, match=f"^validation data {tmp_path}: a file is not RecordIO, CSV or Parquet data: "
                                        f"{tmp_path / 'readme.md'}: text named as documentation"):
        make_shards(tmp_path, what="validation data")


def test_only_zero_record_files(tmp_path):
    shutil.copyfile(TESTDATA / "zero_records.rio", tmp_path / "a.rio")
    (tmp_path / "b.csv").write_bytes(b"")
    with pytest.raises(DataError) as info:
        make_shards(tmp_path, what="training data")
    assert f"the file set under {tmp_path} holds no records" in str(info.value)
    assert str(info.value).startswith("training data")


def test_unknown_content(tmp_path):
    path = tmp_path / "data.orc"
    path.write_bytes(b"ORC\x00\x15")  # neither RecordIO, CSV nor Parquet (PAR1: tests/data/test_parquet.py)
    for call in (lambda: list_data_files(path), lambda: open_reader(path)):
        with pytest.raises(DataError) as info:
            call()
        assert str(path) in str(info.value) and "not RecordIO" in str(info.value)
    assert set(SUPPORTED_EXTENSIONS) == {".csv", ".recordio", ".rio"}  # hints only


def test_make_shards_skips_empty_files(data_dir):
    shards = make_shards(data_dir)
    assert [(os.path.basename(s.source), s.start, s.end) for s in shards] == [
        ("a-part.recordio", 0, 10),
        ("b-part.rio", 0, 30),
    ]
    assert sum(s.size for s in shards) == 40


def test_read_shard_range(data_dir):
    assert read_shard_range(str(data_dir / "b-part.rio"), 4, 9) == MULTI_RECORDS[4:9]
    assert read_shard_range(data_dir / "a-part.recordio", 0, 10) == MULTI_RECORDS[30:40]
    assert read_shard_range(data_dir.parent / "c.csv", 1, 3) == [b"3,4", b"5,6"]
    with pytest.raises(ValueError, match="out of bounds"):
        read_shard_range(data_dir.parent / "c.csv", 0, 4)


def test_open_reader_types_and_cache(data_dir):
    rio = open_reader(data_dir / "b-part.rio")
    assert isinstance(rio, RecordIOReader)
    assert isinstance(open_reader(data_dir.parent / "c.csv"), CSVReader)
    assert isinstance(open_reader(data_dir / "a-part.recordio"), RecordIOReader)
    assert open_reader(str(data_dir / "b-part.rio")) is rio  # cached
    with pytest.raises(DataError, match="found a directory"):
        open_reader(data_dir / "sub.rio")


def test_cache_notices_rewritten_file(tmp_path):
    path = tmp_path / "x.rio"
    write_records(path, [b"a"])
    first = open_reader(path)
    write_records(path, [b"a", b"b", b"c"])
    os.utime(path, ns=(1, 1))  # guarantee a different mtime even on coarse clocks
    assert open_reader(path) is not first and open_reader(path).num_records == 3


def test_corrupt_file_surfaces_through_make_shards(tmp_path):
    from flextrain.data import CorruptRecordIOError

    (tmp_path / "bad.rio").write_bytes(b"\x00" * 25)
    with pytest.raises(CorruptRecordIOError) as info:
        make_shards(tmp_path)
    assert str(tmp_path / "bad.rio") in str(info.value) and info.value.offset == 0


def test_upper_case_extension_supported(tmp_path):
    path = tmp_path / "X.RIO"
    write_records(path, [b"z"])
    assert make_shards(path) == [Shard(str(path), 0, 1)]
