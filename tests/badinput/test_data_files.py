"""Data files are told by content and never skipped in silence (issue 18).

Every file a data path names is RecordIO, CSV, Parquet or empty, whatever its name;
anything else (a stray file, a dangling link, an unreadable file) is refused at
submission naming it, or skipped with --skip-unknown-files and a warning naming
each. Formats mixed are refused. Runs the real CLI entry in-process;
the job itself is not started (run_master is replaced) where a case passes.
"""

from __future__ import annotations

import os
import shutil

import pytest

from badinput_support import run_without_dac_override
from ft_helpers import DIGITS_MODEL, REPO
from flextrain.cli import main, make_parser
from flextrain.data import DataError, DataOptions, clear_reader_cache, make_shards, read_records, \
    read_shard_range, write_records
from flextrain.job import JobSpec, JobSpecError

TESTDATA = REPO / "tests" / "testdata" / "recordio"  # reference files written by the Go library


@pytest.fixture(autouse=True)
def _fresh_reader_cache():
    clear_reader_cache()
    yield
    clear_reader_cache()


@pytest.fixture(scope="module")
def digits_records(digits_data) -> list[bytes]:
    return read_records(digits_data / "train" / "digits-00000.rio")


@pytest.fixture
def shards_dir(tmp_path, digits_records):
    """ElasticDL-style names: data-0000N without an extension, plus a .rio file and an empty file."""
    d = tmp_path / "train"
    d.mkdir()
    third = len(digits_records) // 3
    write_records(d / "data-00000", digits_records[:third])
    write_records(d / "data-00001", digits_records[third:2 * third], max_chunk_size=4096)
    write_records(d / "part.rio", digits_records[2 * third:])
    (d / "data-00002").write_bytes(b"")  # zero records: allowed, as ever
    (d / ".DS_Store").write_bytes(b"\x00\x01 dot-files are passed over")
    (d / "tmp").mkdir()  # so are subdirectories
    return d


@pytest.fixture
def started(monkeypatch):
    """Replaces run_master: records the JobSpec a command would run instead of running it."""
    specs = []
    monkeypatch.setattr("flextrain.master.main.run_master", lambda spec, **kw: specs.append(spec) or 0)
    return specs


def run(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().err


def train(capsys, tmp_path, data, *extra: str) -> tuple[int, str]:
    return run(capsys, "train", "--model-def", DIGITS_MODEL, "--training-data", str(data),
               "--job-dir", str(tmp_path / "job"), "--no-preflight", *extra)


def refused(code: int, err: str, tmp_path, *names) -> str:
    assert code == 2, err
    assert err.startswith("flextrain: error: ") and err.count("\n") == 1, err  # one line
    for name in names:
        assert str(name) in err, (name, err)
    assert not (tmp_path / "job").exists()  # nothing started
    return err


def total(shards) -> int:
    return sum(s.size for s in shards)


def test_elasticdl_shard_names_are_read(shards_dir, digits_records):
    shards = make_shards(shards_dir, what="training data")
    assert [os.path.basename(s.source) for s in shards] == ["data-00000", "data-00001", "part.rio"]
    assert total(shards) == len(digits_records)
    assert [r for s in shards for r in read_shard_range(s.source, s.start, s.end)] == digits_records


def test_elasticdl_shard_names_train(capsys, tmp_path, shards_dir, started):
    code, err = train(capsys, tmp_path, shards_dir)
    assert code == 0 and err == "", err
    assert started[0].data.training == str(shards_dir)


@pytest.mark.parametrize("name, content", [
    ("notes.txt", b"Some notes, written by hand.\nNot data.\n"),
    ("README", b"# the data set\n"),
    ("data-00009", bytes(range(256)) * 4),
    ("weights.bin", b"\x01\x02\x03\x04" * 16),  # the magic, byte-swapped
], ids=["text", "text-no-extension", "binary", "binary-wrong-magic"])
def test_stray_file_is_refused_naming_it(capsys, tmp_path, shards_dir, name, content):
    (shards_dir / name).write_bytes(content)
    err = refused(*train(capsys, tmp_path, shards_dir), tmp_path, shards_dir / name, "--skip-unknown-files")
    assert "not RecordIO, CSV or Parquet data" in err
    assert str(shards_dir / "data-00000") not in err  # good files are not blamed


def test_stray_file_given_as_the_data_path(capsys, tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"\x80\x02}q\x00" * 10)
    err = refused(*train(capsys, tmp_path, path), tmp_path, path)
    assert err == f"flextrain: error: training data file {path} is not RecordIO, CSV or Parquet data: binary, and " \
                  "not RecordIO or Parquet (its first bytes are 80 02 7d 71, not the RecordIO chunk magic 04 03 02 01 " \
                  "or the Parquet magic PAR1)\n"


def test_tfrecord_file_is_named_as_such(capsys, tmp_path):
    from flextrain.data.formats import _crc32c

    length = (5).to_bytes(8, "little")
    crc = _crc32c(length)
    masked = ((((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF).to_bytes(4, "little")
    path = tmp_path / "train.tfrecord"
    path.write_bytes(length + masked + b"hello" + b"\x00" * 4)
    refused(*train(capsys, tmp_path, path), tmp_path, path, "a TFRecord file")


def test_skip_unknown_files_warns_naming_each(capsys, tmp_path, shards_dir, digits_records, started):
    stray = [shards_dir / "notes.txt", shards_dir / "blob", shards_dir / "gone"]
    stray[0].write_text("Some notes, written by hand.\nNot data.\n")
    stray[1].write_bytes(bytes(range(256)))
    os.symlink(tmp_path / "nowhere", stray[2])
    code, err = train(capsys, tmp_path, shards_dir, "--skip-unknown-files")
    assert code == 0, err
    assert err == ""  # told once, by the master: a job event (printed above the bar, kept in status)
    assert started[0].data.skip_unknown_files is True

    # The master plans the good records only, and hands the warning over for the job's events.
    from flextrain.master.main import build_ledger

    skipped: list[str] = []
    ledger = build_ledger(started[0], skipped)
    assert ledger.records_total == len(digits_records)
    (warning,) = skipped
    assert warning.startswith(f"training data {shards_dir}: skipped 3 files that are not "
                              "RecordIO, CSV or Parquet data (--skip-unknown-files): ")
    for path in stray:
        assert str(path) in warning
    assert f"a dangling symbolic link to {tmp_path / 'nowhere'}" in warning


def test_a_global_batch_larger_than_every_file_is_warned_about(capsys, tmp_path, shards_dir, digits_records,
                                                                started):
    third = len(digits_records) // 3
    largest = len(digits_records) - 2 * third  # part.rio
    code, err = train(capsys, tmp_path, shards_dir, "--global-batch-size", str(largest + 1))
    assert code == 0 and len(started) == 1, err
    assert err == (f"flextrain: warning: --global-batch-size {largest + 1} is larger than every piece of the "
                   f"training data (the largest, {shards_dir / 'part.rio'} records [0, {largest}), holds {largest}); "
                   f"a step never spans two, so every step trains fewer than {largest + 1} samples\n")
    code, err = train(capsys, tmp_path, shards_dir, "--global-batch-size", str(largest), "--overwrite")
    assert code == 0 and err == ""  # one file's steps can be whole: no warning


def test_dangling_symlink_is_refused_naming_it(capsys, tmp_path, shards_dir):
    link = shards_dir / "data-00003"
    os.symlink(tmp_path / "moved-away", link)
    err = refused(*train(capsys, tmp_path, shards_dir), tmp_path, link, tmp_path / "moved-away")
    assert "a dangling symbolic link" in err


def test_unreadable_file_is_refused_naming_it(capsys, tmp_path, shards_dir):
    path = shards_dir / "data-00001"
    path.chmod(0)
    try:
        if os.geteuid() == 0:  # root reads files whatever their mode: drop that capability
            proc = run_without_dac_override("train", "--model-def", DIGITS_MODEL, "--training-data",
                                            str(shards_dir), "--job-dir", str(tmp_path / "job"), "--no-preflight")
            code, err = proc.returncode, proc.stderr
        else:
            code, err = train(capsys, tmp_path, shards_dir)
    finally:
        path.chmod(0o644)
    err = refused(code, err, tmp_path, path)
    assert "cannot be read (Permission denied)" in err


def test_fifo_is_refused_without_blocking(capsys, tmp_path, shards_dir):
    fifo = shards_dir / "data-00004"
    os.mkfifo(fifo)  # opening it would wait for a writer forever
    err = refused(*train(capsys, tmp_path, shards_dir), tmp_path, fifo)
    assert "a FIFO, not a regular file" in err


def test_mixed_recordio_and_csv_is_refused(capsys, tmp_path, shards_dir):
    (shards_dir / "extra.csv").write_text("1,2\n3,4\n")
    err = refused(*train(capsys, tmp_path, shards_dir), tmp_path, "RecordIO", "CSV",
                  shards_dir / "data-00000", shards_dir / "extra.csv")
    assert "mixes RecordIO and CSV files" in err


def test_glob(capsys, tmp_path, shards_dir, digits_records, started):
    pattern = str(shards_dir / "data-*")
    assert total(make_shards(pattern)) == len(digits_records) - len(read_records(shards_dir / "part.rio"))
    code, err = train(capsys, tmp_path, pattern)
    assert code == 0 and err == "", err
    assert started[0].data.training == pattern


def test_glob_matching_nothing_is_refused(capsys, tmp_path, shards_dir):
    pattern = shards_dir / "part-*"
    err = refused(*train(capsys, tmp_path, pattern), tmp_path, pattern)
    assert err == f"flextrain: error: training data pattern {pattern} matches no file\n"


def test_comma_separated_list(capsys, tmp_path, shards_dir, digits_records, started, monkeypatch):
    monkeypatch.chdir(shards_dir)
    code, err = train(capsys, tmp_path, "data-00000, part.rio")
    assert code == 0 and err == "", err
    assert started[0].data.training == f"{shards_dir / 'data-00000'},{shards_dir / 'part.rio'}"
    shards = make_shards(started[0].data.training)
    assert [os.path.basename(s.source) for s in shards] == ["data-00000", "part.rio"]
    assert total(shards) == len(read_records("data-00000")) + len(read_records("part.rio"))
    err = refused(*train(capsys, tmp_path, "data-00000,missing.rio"), tmp_path, shards_dir / "missing.rio")
    assert "training data file not found" in err


def test_csv_header(capsys, tmp_path, started):
    d = tmp_path / "csv"
    d.mkdir()
    (d / "part-0").write_text("x,y,label\n1,2,0\n3,4,1\n")  # CSV by content: no extension needed
    (d / "part-1").write_text("x,y,label\r\n5,6,1\r\n")
    (d / "part-2").write_text("x,y,label\n")  # a header only: no records
    with_header = make_shards(d, options=DataOptions(csv_header=True))
    assert [(os.path.basename(s.source), s.start, s.end) for s in with_header] == [("part-0", 1, 3), ("part-1", 1, 2)]
    assert [r for s in with_header for r in read_shard_range(s.source, s.start, s.end)] == \
        [b"1,2,0", b"3,4,1", b"5,6,1"]
    assert total(make_shards(d)) == 6  # without the flag the headers are records
    code, err = train(capsys, tmp_path, d, "--csv-header", "--global-batch-size", "2")  # the largest file's 2 records
    assert code == 0 and err == "", err
    assert started[0].data.csv_header is True
    only_header = tmp_path / "h.csv"
    only_header.write_text("x,y,label\n")
    with pytest.raises(DataError, match="holds no records .*a CSV header only"):
        make_shards(only_header, options=DataOptions(csv_header=True))


def test_single_column_csv_needs_its_extension(tmp_path):
    (tmp_path / "labels").write_text("0\n1\n1\n")
    with pytest.raises(DataError, match="text that is not CSV"):
        make_shards(tmp_path / "labels")
    shutil.copyfile(tmp_path / "labels", tmp_path / "labels.csv")
    assert total(make_shards(tmp_path / "labels.csv")) == 3


def test_damaged_rio_is_reported_as_corrupt_not_unknown(tmp_path):
    from flextrain.data import CorruptRecordIOError

    shutil.copyfile(TESTDATA / "none_small.rio", tmp_path / "a.rio")
    (tmp_path / "b.rio").write_bytes(b"\x00" * 25)
    with pytest.raises(CorruptRecordIOError, match="b.rio"):
        make_shards(tmp_path, options=DataOptions(skip_unknown_files=True))


def test_flags_on_evaluate_and_predict_and_jobspec():
    parser = make_parser()
    for command, data in (("evaluate", "--validation-data"), ("predict", "--prediction-data")):
        extra = ["--output", "out"] if command == "predict" else []
        args = parser.parse_args([command, "--model-def", "m.py:M", "--checkpoint", "c", data, "d", *extra,
                                  "--skip-unknown-files", "--csv-header"])
        assert args.skip_unknown_files and args.csv_header
    spec = JobSpec.of(name="j", model_def="m.py:M", training_data="/d", job_dir="/j", csv_header=True)
    assert JobSpec.from_json(spec.validate().to_json()).data.csv_header is True
    with pytest.raises(JobSpecError, match="--skip-unknown-files must be true or false, got 'yes'"):
        spec.replace(skip_unknown_files="yes").validate()


def test_elasticjob_fields():
    from flextrain.k8s.resource import jobspec_from_resource, resource_from_jobspec

    spec = JobSpec.of(name="j", model_def="m.py:M", training_data="/data/part-*", job_dir="/j",
                   skip_unknown_files=True, csv_header=True)
    body = resource_from_jobspec(spec, image="img", namespace="ns")
    assert body["spec"]["data"]["skipUnknownFiles"] is True and body["spec"]["data"]["csvHeader"] is True
    back = jobspec_from_resource(body)
    assert back.data.skip_unknown_files is True and back.data.csv_header is True


@pytest.mark.e2e
def test_job_over_headed_csv_shards_with_a_stray_file(tmp_path):
    """Real master and workers: extension-less CSV shards with headers, a stray file skipped and noted."""
    from ft_helpers import read_status, run_flextrain

    def write(path, xs):  # stepcount's records: x,label (accuracy 0.8 over x = 0..99)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x,label\n" + "".join(f"{x},{x % 3 if x % 5 else (x + 1) % 3}\n" for x in xs))

    write(tmp_path / "train" / "data-00000", range(0, 320))
    write(tmp_path / "train" / "data-00001", range(320, 640))
    (tmp_path / "train" / "_README").write_text("written by the export job\n")
    write(tmp_path / "validation" / "data-00000", range(100))
    job_dir = tmp_path / "job"
    proc = run_flextrain(
        "train", "--model-def", f"{REPO / 'tests' / 'evaluation' / 'zoo' / 'stepcount.py'}:Model",
        "--training-data", str(tmp_path / "train"), "--validation-data", str(tmp_path / "validation"),
        "--csv-header", "--skip-unknown-files", "--global-batch-size", "32", "--job-dir", str(job_dir),
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    warning = (f"training data {tmp_path / 'train'}: skipped 1 file that is not RecordIO, CSV or Parquet data "
               f"(--skip-unknown-files): {tmp_path / 'train' / '_README'}: text that is not CSV")
    assert proc.stderr.count(warning) == 1, proc.stderr  # once (it was told twice: the CLI's, the job's event)
    status = read_status(job_dir)
    assert status["phase"] == "Succeeded"
    assert status["progress"]["recordsDone"] == 640  # no header trained on
    assert any(event.startswith(warning) for event in status["events"])
    assert status["metrics"]["x"] == 49.5 and status["metrics"]["accuracy"] == 0.8  # 100 records, no header
