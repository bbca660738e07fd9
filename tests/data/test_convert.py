"""`flextrain data convert`: every source format round-trips exactly through the shards and decode_rows."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flextrain.cli import main
from flextrain.data import RecordIOReader, list_data_files
from flextrain.data.convert import ConvertOptions, convert
from flextrain.data.rows import Field, Schema, decode_rows, encode_rows, load_schema

REPO = Path(__file__).resolve().parents[2]


def read_back(out: Path) -> dict:
    """Every shard's records (in shard order) decoded with the written schema."""
    schema = load_schema(out)
    records = [r for name, _ in schema.shards for r in RecordIOReader(out / name)]
    assert len(records) == schema.records
    return decode_rows(records, schema)


def run_cli(*args: str) -> int:
    return main(["data", *args])


# ---- the encoding itself --------------------------------------------------------------
def test_encode_decode_fixed_and_variable_fields():
    schema = Schema(fields=(Field("x", "float16", (2,)), Field("n", "uint64"), Field("v", "int32", (-1, 2)),
                            Field("s", "string"), Field("b", "bytes"), Field("ok", "bool")))
    cols = {"x": np.array([[1.5, -2], [0.25, 7]], np.float16), "n": np.array([2**64 - 1, 0], np.uint64),
            "v": [np.arange(4, dtype=np.int32).reshape(2, 2), np.zeros((0, 2), np.int32)],
            "s": ["héllo", ""], "b": [b"\x00\x01", b""], "ok": np.array([True, False])}
    records = encode_rows(cols, schema)
    # x: 4 bytes, n: 8, v: 4 + 16, s: 4 + 6, b: 4 + 2, ok: 1
    assert len(records[0]) == 4 + 8 + 4 + 16 + 4 + 6 + 4 + 2 + 1
    out = decode_rows(records, schema)
    assert out["x"].dtype == np.float16 and np.array_equal(out["x"], cols["x"])
    assert out["n"].tolist() == [2**64 - 1, 0]
    assert [a.shape for a in out["v"]] == [(2, 2), (0, 2)] and np.array_equal(out["v"][0], cols["v"][0])
    assert out["s"] == ["héllo", ""] and out["b"] == [b"\x00\x01", b""] and out["ok"].tolist() == [True, False]


def test_fixed_records_are_packed_little_endian_in_schema_order():
    schema = Schema(fields=(Field("a", "int16"), Field("b", "float32", (2,))))
    [record] = encode_rows({"a": np.array([1]), "b": np.array([[1.0, 2.0]])}, schema)
    assert record == np.int16(1).tobytes() + np.array([1.0, 2.0], "<f4").tobytes()
    with pytest.raises(ValueError, match="record 0 has 5 bytes"):
        decode_rows([record[:5]], schema)


# ---- round trips per source ------------------------------------------------------------
def write_csv(path: Path, rows, header=None) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        if header:
            w.writerow(header)
        w.writerows(rows)


@pytest.fixture
def table():
    rng = np.random.default_rng(0)
    return {"f": rng.normal(size=23), "i": rng.integers(-5, 5, size=23), "s": [f"row {k}, \"q\"" for k in range(23)]}


@pytest.mark.parametrize("fmt", ["recordio", "example"])
def test_csv_round_trip(tmp_path, table, fmt):
    write_csv(tmp_path / "t.csv", zip(map(repr, map(float, table["f"])), table["i"], table["s"]), header=["f", "i", "s"])
    assert run_cli("convert", str(tmp_path / "t.csv"), "--out", str(tmp_path / "o"), "--format", fmt,
                   "--shard-size", "10", "--quiet") == 0
    schema = load_schema(tmp_path / "o")
    assert [(f.name, f.dtype, f.shape) for f in schema.fields] == \
        [("f", "float64" if fmt == "recordio" else "float32", ()), ("i", "int64", ()), ("s", "string", ())]
    assert schema.format == fmt and schema.source_kind == "csv"
    out = read_back(tmp_path / "o")
    assert np.array_equal(out["f"], table["f"].astype(out["f"].dtype)) and out["f"].dtype == schema.fields[0].dtype
    assert np.array_equal(out["i"], table["i"]) and out["s"] == table["s"]
    assert sorted(os.listdir(tmp_path / "o")) == ["data-00000", "data-00001", "data-00002", "schema.json"]
    assert schema.shards == (("data-00000", 10), ("data-00001", 10), ("data-00002", 3)) and schema.records == 23


def test_csv_header_detection_and_flags(tmp_path):
    write_csv(tmp_path / "n.csv", [[1, 2.5], [3, 4.5]])
    run_cli("convert", str(tmp_path / "n.csv"), "--out", str(tmp_path / "a"), "--quiet")
    schema = load_schema(tmp_path / "a")
    assert [(f.name, f.dtype) for f in schema.fields] == [("c0", "int64"), ("c1", "float64")] and schema.records == 2
    write_csv(tmp_path / "s.csv", [["x", "y"], ["p", "q"]])
    run_cli("convert", str(tmp_path / "s.csv"), "--out", str(tmp_path / "b"), "--header", "--quiet")
    assert [f.name for f in load_schema(tmp_path / "b").fields] == ["x", "y"]
    run_cli("convert", str(tmp_path / "s.csv"), "--out", str(tmp_path / "c"), "--no-header", "--quiet")
    assert read_back(tmp_path / "c")["c0"] == ["x", "p"]


@pytest.mark.parametrize("fmt", ["recordio", "example"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "uint8", "int32"])
def test_npy_round_trip_keeps_the_dtype(tmp_path, dtype, fmt):
    x = (np.random.default_rng(1).normal(size=(12, 3, 2)) * 20).astype(dtype)
    np.save(tmp_path / "x.npy", x)
    convert(tmp_path / "x.npy", tmp_path / "o", ConvertOptions(format=fmt, shard_size=5))
    out = read_back(tmp_path / "o")["x"]
    expected = x.astype(np.float32) if fmt == "example" and dtype == "float64" else x
    assert out.dtype == expected.dtype and out.shape == (12, 3, 2) and np.array_equal(out, expected)


def test_npy_field_name_and_strings(tmp_path):
    np.save(tmp_path / "w.npy", np.array(["a", "bé", ""]))
    run_cli("convert", str(tmp_path / "w.npy"), "--out", str(tmp_path / "o"), "--field", "word", "--quiet")
    assert read_back(tmp_path / "o") == {"word": ["a", "bé", ""]}


@pytest.mark.parametrize("fmt", ["recordio", "example"])
def test_npz_round_trip(tmp_path, fmt):
    rng = np.random.default_rng(2)
    arrays = {"img": rng.integers(0, 255, size=(9, 4, 4, 3), dtype=np.uint8), "y": np.arange(9, dtype=np.int64),
              "w": rng.normal(size=(9,)).astype(np.float32)}
    np.savez(tmp_path / "d.npz", **arrays)
    convert(tmp_path / "d.npz", tmp_path / "o", ConvertOptions(format=fmt, shard_size=4, workers=2))
    schema = load_schema(tmp_path / "o")
    assert [(f.name, f.dtype, f.shape) for f in schema.fields] == \
        [("img", "uint8", (4, 4, 3)), ("y", "int64", ()), ("w", "float32", ())]
    out = read_back(tmp_path / "o")
    for name, arr in arrays.items():
        assert out[name].dtype == arr.dtype and np.array_equal(out[name], arr), name


@pytest.mark.parametrize("fmt", ["recordio", "example"])
def test_parquet_round_trip_file_and_directory(tmp_path, fmt):
    import pyarrow as pa
    import pyarrow.parquet as pq

    vec = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.float32)), 3)
    table = pa.table({"h": pa.array(np.array([0.5, 1.5, -2, 3], np.float16)), "vec": vec,
                      "seq": pa.array([[1, 2], [], [3], [4, 5, 6]], pa.list_(pa.int64())),
                      "name": ["a", "b", "c", "d"], "flag": [True, False, True, True]})
    pq.write_table(table, tmp_path / "t.parquet")
    (tmp_path / "dir").mkdir()
    pq.write_table(table.slice(0, 2), tmp_path / "dir" / "part-0.parquet")
    pq.write_table(table.slice(2), tmp_path / "dir" / "part-1")  # no extension: told by its PAR1 magic
    for src, out in ((tmp_path / "t.parquet", tmp_path / "o1"), (tmp_path / "dir", tmp_path / "o2")):
        convert(src, out, ConvertOptions(format=fmt, shard_size=3))
        schema = load_schema(out)
        assert [(f.name, f.dtype, f.shape) for f in schema.fields] == [
            ("h", "float16", ()), ("vec", "float32", (3,)), ("seq", "int64", (-1,)), ("name", "string", ()),
            ("flag", "bool", ())]
        got = read_back(out)
        assert got["h"].dtype == np.float16 and got["h"].tolist() == [0.5, 1.5, -2, 3]
        assert np.array_equal(got["vec"], np.arange(12, dtype=np.float32).reshape(4, 3))
        assert [a.tolist() for a in got["seq"]] == [[1, 2], [], [3], [4, 5, 6]]
        assert got["name"] == ["a", "b", "c", "d"] and got["flag"].tolist() == [True, False, True, True]


@pytest.mark.parametrize("fmt", ["recordio", "example"])
def test_jsonl_round_trip(tmp_path, fmt):
    rows = [{"x": [1.5, 2.0], "n": 3, "t": "a", "ok": True, "v": [1, 2, 3]},
            {"x": [0.25, -1.0], "n": -4, "t": "b", "ok": False, "v": [7]}]
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    convert(tmp_path / "r.jsonl", tmp_path / "o", ConvertOptions(format=fmt))
    schema = load_schema(tmp_path / "o")
    assert [(f.name, f.dtype, f.shape) for f in schema.fields] == [
        ("x", "float64" if fmt == "recordio" else "float32", (2,)), ("n", "int64", ()), ("t", "string", ()),
        ("ok", "bool", ()), ("v", "int64", (-1,))]
    got = read_back(tmp_path / "o")
    assert got["x"].tolist() == [[1.5, 2.0], [0.25, -1.0]] and got["n"].tolist() == [3, -4]
    assert got["t"] == ["a", "b"] and got["ok"].tolist() == [True, False]
    assert [a.tolist() for a in got["v"]] == [[1, 2, 3], [7]]


def make_images(root: Path, *, sizes=((4, 3),) * 5) -> list[tuple[np.ndarray, int]]:
    from PIL import Image

    rng = np.random.default_rng(3)
    made = []
    for k, (w, h) in enumerate(sizes):
        cls = ("cat", "dog")[k % 2]
        (root / cls).mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / cls / f"img{k}.png")
        made.append((pixels, k % 2, f"{cls}/img{k}.png"))
    made.sort(key=lambda m: m[2])  # ImageFolder's order: class by class, sorted paths
    return [(p, label) for p, label, _ in made]


@pytest.mark.parametrize("fmt", ["recordio", "example"])
def test_image_folder_round_trip(tmp_path, fmt):
    made = make_images(tmp_path / "imgs")
    (tmp_path / "imgs" / "cat" / "notes.txt").write_text("not an image")  # passed over, as ImageFolder does
    convert(tmp_path / "imgs", tmp_path / "o", ConvertOptions(format=fmt, shard_size=2, workers=2))
    schema = load_schema(tmp_path / "o")
    assert schema.class_names == ("cat", "dog")
    assert [(f.name, f.dtype, f.shape) for f in schema.fields] == [("image", "uint8", (3, 4, 3)), ("label", "int64", ())]
    got = read_back(tmp_path / "o")
    assert got["image"].dtype == np.uint8 and np.array_equal(got["image"], np.stack([p for p, _ in made]))
    assert got["label"].tolist() == [label for _, label in made]


def test_images_of_different_sizes_are_stored_as_file_bytes(tmp_path):
    from PIL import Image
    import io

    made = make_images(tmp_path / "imgs", sizes=((4, 3), (5, 2), (4, 3)))
    convert(tmp_path / "imgs", tmp_path / "o")
    assert [(f.name, f.dtype) for f in load_schema(tmp_path / "o").fields] == [("image", "bytes"), ("label", "int64")]
    got = read_back(tmp_path / "o")
    decoded = [np.asarray(Image.open(io.BytesIO(b))) for b in got["image"]]
    assert all(np.array_equal(d, p) for d, (p, _) in zip(decoded, made))


# ---- shards, workers, output directory ---------------------------------------------------
def test_output_is_identical_for_one_and_three_workers(tmp_path):
    x = np.random.default_rng(4).normal(size=(101, 5))
    write_csv(tmp_path / "x.csv", x.tolist())
    run_cli("convert", str(tmp_path / "x.csv"), "--out", str(tmp_path / "w1"), "--workers", "1", "--shard-size",
            "20", "--quiet")
    run_cli("convert", str(tmp_path / "x.csv"), "--out", str(tmp_path / "w3"), "--workers", "3", "--shard-size",
            "20", "--quiet")
    names = sorted(os.listdir(tmp_path / "w1"))
    assert names == [f"data-0000{i}" for i in range(6)] + ["schema.json"] == sorted(os.listdir(tmp_path / "w3"))
    for name in names[:-1]:
        assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w3" / name).read_bytes(), name
    assert [len(RecordIOReader(tmp_path / "w3" / n)) for n in names[:-1]] == [20] * 5 + [1]
    assert np.array_equal(read_back(tmp_path / "w3")["c4"], x[:, 4])
    # the converted directory is a training data path as it is: schema.json is passed over
    assert [Path(p).name for p in list_data_files(tmp_path / "w3")] == names[:-1]


def test_a_non_empty_out_is_refused_unless_overwrite(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.arange(10))
    assert run_cli("convert", str(tmp_path / "x.npy"), "--out", str(tmp_path / "o"), "--shard-size", "3",
                   "--quiet") == 0
    capsys.readouterr()
    assert run_cli("convert", str(tmp_path / "x.npy"), "--out", str(tmp_path / "o"), "--quiet") == 2
    err = capsys.readouterr().err
    assert "is not empty" in err and "pass --overwrite" in err
    assert run_cli("convert", str(tmp_path / "x.npy"), "--out", str(tmp_path / "o"), "--overwrite", "--quiet") == 0
    assert sorted(os.listdir(tmp_path / "o")) == ["data-00000", "schema.json"]  # the 4 old shards are gone


def test_a_failing_shard_leaves_no_shard_under_a_final_name(tmp_path, capsys):
    make_images(tmp_path / "imgs", sizes=((4, 3),) * 4)
    (tmp_path / "imgs" / "dog" / "img1.png").write_bytes(
        (tmp_path / "imgs" / "dog" / "img1.png").read_bytes()[:60])  # header intact, pixels cut off
    assert run_cli("convert", str(tmp_path / "imgs"), "--out", str(tmp_path / "o"), "--shard-size", "1",
                   "--workers", "1", "--quiet") == 2
    assert "img1.png cannot be decoded" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # the directory it made is gone with what it held
    (tmp_path / "given").mkdir()
    assert run_cli("convert", str(tmp_path / "imgs"), "--out", str(tmp_path / "given"), "--shard-size", "1",
                   "--workers", "1", "--quiet") == 2
    assert os.listdir(tmp_path / "given") == []  # a directory the user made stays, holding no shard


# ---- clear errors --------------------------------------------------------------------------
def error_of(capsys, *args: str) -> str:
    assert run_cli("convert", *args, "--quiet") == 2
    err = capsys.readouterr().err
    assert err.startswith("flextrain: error: ")
    return err


def test_bad_inputs_are_named(tmp_path, capsys):
    (tmp_path / "r.csv").write_text("a,b\n1,2\n3\n")
    assert "r.csv, line 3: 1 field(s), but line 1 has 2 (a ragged CSV line)" in \
        error_of(capsys, str(tmp_path / "r.csv"), "--out", str(tmp_path / "o1"))
    (tmp_path / "q.csv").write_text('a,b,label\n1,2,0\n3,"4,1\n5,6,1\n7,8,0\n')
    assert "q.csv, line 3: a quoted field runs from there to line 5, leaving 2 field(s) where line 1 has 3 (a quote " \
           "not closed?)" in error_of(capsys, str(tmp_path / "q.csv"), "--out", str(tmp_path / "oq"))
    (tmp_path / "r.jsonl").write_text('{"a": 1}\n{"a": 2\n')
    assert "r.jsonl, line 2: not JSON" in error_of(capsys, str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "o2"))
    np.savez(tmp_path / "d.npz", x=np.zeros(5), y=np.zeros(4))
    assert "arrays have different lengths (first dimension): x=5, y=4" in \
        error_of(capsys, str(tmp_path / "d.npz"), "--out", str(tmp_path / "o3"))
    (tmp_path / "imgs" / "a").mkdir(parents=True)
    (tmp_path / "imgs" / "a" / "bad.png").write_bytes(b"not a png")
    assert f"image {tmp_path / 'imgs' / 'a' / 'bad.png'} cannot be decoded" in \
        error_of(capsys, str(tmp_path / "imgs"), "--out", str(tmp_path / "o4"))
    assert f"source not found: {tmp_path / 'nope.csv'}" in \
        error_of(capsys, str(tmp_path / "nope.csv"), "--out", str(tmp_path / "o5"))
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01\x02")
    assert "cannot tell the format of" in error_of(capsys, str(tmp_path / "blob.bin"), "--out", str(tmp_path / "o6"))
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.txt").write_text("x")
    assert "neither an image folder" in error_of(capsys, str(tmp_path / "mixed"), "--out", str(tmp_path / "o7"))
    (tmp_path / "k.jsonl").write_text('{"a": 1}\n{"b": 2}\n')
    assert "k.jsonl, line 2: keys differ from line 1's (missing ['a']) (extra ['b'])" in \
        error_of(capsys, str(tmp_path / "k.jsonl"), "--out", str(tmp_path / "o8"))
    assert "--shard-size must be at least 1" in \
        error_of(capsys, str(tmp_path / "r.csv"), "--out", str(tmp_path / "o9"), "--shard-size", "0")
    for name, text in (("h.csv", "a,b,label\n"), ("hb.csv", "a,b,label\n\n\n"), ("one.csv", "1,2,3\n")):
        (tmp_path / name).write_text(text)
        flags = ("--header",) if name == "one.csv" else ()
        assert error_of(capsys, str(tmp_path / name), "--out", str(tmp_path / "o10"), *flags) == \
            f"flextrain: error: {tmp_path / name} holds no records\n"
        assert not (tmp_path / "o10").exists()


def test_convert_as_a_real_subprocess(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.arange(30, dtype=np.float32).reshape(10, 3), y=np.arange(10))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "flextrain", "data", "convert", str(tmp_path / "d.npz"), "--out",
                           str(tmp_path / "o"), "--shard-size", "4", "--workers", "2"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("converted 10 records (npz -> recordio, 2 fields) into 3 shards in ")
    assert len(proc.stdout.strip().splitlines()) == 1 and "\x1b" not in proc.stderr  # no bar: not a TTY
    got = read_back(tmp_path / "o")
    assert np.array_equal(got["x"], np.arange(30, dtype=np.float32).reshape(10, 3))


# ---- CSV parsed by the workers (flextrain.data.convert.csvsplit) -----------------------------
def whole_file_shards(src: Path, out: Path, monkeypatch, **options) -> None:
    """The reference: the whole-file path (the calling process parses every row), as before the split."""
    from flextrain.data.convert import csvsplit

    with monkeypatch.context() as m:
        m.setattr(csvsplit, "plan_csv", lambda *a, **k: None)
        convert(src, out, ConvertOptions(**options))


def test_a_large_csv_split_across_workers_matches_the_whole_file_path(tmp_path, monkeypatch):
    from flextrain.data.convert import csvsplit

    rng = np.random.default_rng(5)
    n = 3000
    x = rng.normal(size=n)
    ints = rng.integers(-1000, 1000, size=n)
    late_float = ints.astype(str).astype(object)
    late_float[2500] = "0.5"  # an int column until shard 5 of 6: int64 narrows nothing, float64 it is
    words = rng.integers(0, 50, size=n).astype(str).astype(object)
    words[1700] = "seven"  # numbers until shard 3: a string column
    lines = ["x,i,late,w"] + [f"{float(a)!r},{b},{c},{d}" for a, b, c, d in zip(x, ints, late_float, words)]
    lines.insert(900, "")  # blank lines are no records
    lines.insert(1800, "")
    (tmp_path / "big.csv").write_bytes(("\r\n".join(lines) + "\r\n").encode())  # CRLF line ends
    assert csvsplit.plan_csv(str(tmp_path / "big.csv")).num_rows == n  # the parallel path is taken
    for fmt in ("recordio", "example"):
        for k in (1, 2, 3):
            convert(tmp_path / "big.csv", tmp_path / f"{fmt}{k}", ConvertOptions(format=fmt, shard_size=500, workers=k))
        whole_file_shards(tmp_path / "big.csv", tmp_path / f"{fmt}-whole", monkeypatch, format=fmt, shard_size=500)
        schema = load_schema(tmp_path / f"{fmt}1")
        assert [(f.name, f.dtype) for f in schema.fields] == [
            ("x", "float64" if fmt == "recordio" else "float32"), ("i", "int64"),
            ("late", "float64" if fmt == "recordio" else "float32"), ("w", "string")]
        assert schema.shards == tuple((f"data-0000{i}", 500) for i in range(6))
        names = sorted(os.listdir(tmp_path / f"{fmt}-whole"))
        for k in (1, 2, 3):
            assert sorted(os.listdir(tmp_path / f"{fmt}{k}")) == names
            for name in names:
                assert (tmp_path / f"{fmt}{k}" / name).read_bytes() == (tmp_path / f"{fmt}-whole" / name).read_bytes()
    got = read_back(tmp_path / "recordio2")
    assert np.array_equal(got["x"], x) and np.array_equal(got["i"], ints)
    assert got["late"][2500] == 0.5 and got["w"][1700] == "seven" and got["w"][0] == str(words[0])


def test_split_csv_errors_name_the_line_in_the_file(tmp_path, capsys):
    rows = [f"{k},{k * 2}" for k in range(1000)]
    rows[777] = "1,2,3"
    (tmp_path / "r.csv").write_text("a,b\n\n" + "\n".join(rows) + "\n")
    for workers in ("1", "2"):
        assert "r.csv, line 780: 3 field(s), but line 1 has 2 (a ragged CSV line)" in error_of(
            capsys, str(tmp_path / "r.csv"), "--out", str(tmp_path / f"o{workers}"), "--shard-size", "100",
            "--workers", workers)
        assert not (tmp_path / f"o{workers}").exists()  # nothing left behind
    (tmp_path / "u.csv").write_bytes(b"a,b\n" + b"1,2\n" * 300 + b"3,\xff\n")
    assert f"u.csv is not UTF-8 text (invalid start byte at byte {4 + 4 * 300 + 2})" in \
        error_of(capsys, str(tmp_path / "u.csv"), "--out", str(tmp_path / "o3"), "--shard-size", "100")


def test_quotes_or_lone_carriage_returns_keep_the_whole_file_path(tmp_path):
    from flextrain.data.convert import csvsplit

    write_csv(tmp_path / "q.csv", [[k, f"line\nbreak {k}"] for k in range(50)], header=["n", "s"])
    assert csvsplit.plan_csv(str(tmp_path / "q.csv")) is None
    convert(tmp_path / "q.csv", tmp_path / "o", ConvertOptions(shard_size=7, workers=2))
    got = read_back(tmp_path / "o")
    assert got["s"] == [f"line\nbreak {k}" for k in range(50)] and got["n"].tolist() == list(range(50))
    (tmp_path / "cr.csv").write_bytes(b"a,b\r1,2\r3,4\r")
    assert csvsplit.plan_csv(str(tmp_path / "cr.csv")) is None
    convert(tmp_path / "cr.csv", tmp_path / "o2", ConvertOptions(workers=2))
    assert read_back(tmp_path / "o2")["b"].tolist() == [2, 4]
