"""`flextrain data inspect`: schema, counted records, the first records, as text and as JSON."""

from __future__ import annotations

import json
import os

import numpy as np

from flextrain.cli import main
from flextrain.data import write_records
from flextrain.data.convert import ConvertOptions, convert
from flextrain.data.example import encode_example


def inspect(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["data", "inspect", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_inspect_text_and_json(tmp_path, capsys):
    np.savez(tmp_path / "d.npz", x=np.arange(50, dtype=np.float16).reshape(5, 10), y=np.arange(5))
    convert(tmp_path / "d.npz", tmp_path / "o", ConvertOptions(shard_size=2))
    code, out, _ = inspect(capsys, str(tmp_path / "o"), "--head", "2")
    assert code == 0
    assert f"{tmp_path / 'o'}: 5 records in 3 shards" in out
    assert "  x: float16 [10]" in out and "  y: int64 []" in out
    assert "record count agrees with schema.json (5)" in out
    assert "record 1:" in out and "record 2:" not in out and '"first": [10.0, 11.0' in out
    code, out, _ = inspect(capsys, str(tmp_path / "o"), "--json")
    info = json.loads(out)
    assert info["records"] == 5 and info["agrees"] is True and info["decoded_as"] == "schema"
    assert [s["records"] for s in info["shards"]] == [2, 2, 1]
    assert info["schema"]["fields"] == [{"name": "x", "dtype": "float16", "shape": [10]},
                                        {"name": "y", "dtype": "int64", "shape": []}]
    assert [r["y"] for r in info["head"]] == [0, 1, 2]
    assert info["head"][0]["x"] == {"dtype": "float16", "shape": [10], "first": list(map(float, range(8)))}


def test_inspect_says_when_the_shards_disagree_with_the_schema(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.arange(6))
    convert(tmp_path / "x.npy", tmp_path / "o", ConvertOptions(shard_size=3))
    write_records(tmp_path / "o" / "data-00001", [np.int64(1).tobytes()])  # a shard rewritten with 1 record
    code, out, _ = inspect(capsys, str(tmp_path / "o"))
    assert code == 1  # a check that found a problem: scripts can tell
    assert "DISAGREES" in out and "data-00001 holds 1 records, schema.json says 3" in out
    assert "the shards hold 4 records, schema.json says 6" in out
    code, out, _ = inspect(capsys, str(tmp_path / "o"), "--json")
    assert code == 1 and json.loads(out)["agrees"] is False


def test_inspect_one_shard_file_decodes_it_with_its_directorys_schema(tmp_path, capsys):
    np.savez(tmp_path / "d.npz", x=np.arange(50, dtype=np.float16).reshape(5, 10), y=np.arange(5))
    convert(tmp_path / "d.npz", tmp_path / "o", ConvertOptions(shard_size=2))
    code, out, _ = inspect(capsys, str(tmp_path / "o" / "data-00001"), "--json")
    info = json.loads(out)
    assert code == 0 and info["records"] == 2 and [s["name"] for s in info["shards"]] == ["data-00001"]
    assert info["decoded_as"] == "schema" and [r["y"] for r in info["head"]] == [2, 3]
    assert info["agrees"] is None  # one shard is not the whole set: no count to check


def test_inspect_without_a_schema(tmp_path, capsys):
    (tmp_path / "ex").mkdir()
    write_records(tmp_path / "ex" / "part-0", [encode_example({"label": [k], "w": [0.5, 1.0]}) for k in range(4)])
    code, out, _ = inspect(capsys, str(tmp_path / "ex"), "--json")
    info = json.loads(out)
    assert info["schema"] is None and info["agrees"] is None and info["records"] == 4
    assert info["decoded_as"] == "example" and info["head"][1] == {"label": [1], "w": [0.5, 1.0]}
    (tmp_path / "raw").mkdir()
    write_records(tmp_path / "raw" / "data-00000", [b"\xff\xff\xff" * 3, b"\xfe"])
    code, out, _ = inspect(capsys, str(tmp_path / "raw"))
    assert "2 records in 1 shard" in out and "no schema.json: records shown as raw bytes" in out
    assert "  bytes: 9" in out and 'first_bytes: "ff ff ff' in out


def test_inspect_errors(tmp_path, capsys):
    (tmp_path / "text.txt").write_text("not RecordIO")
    code, _, err = inspect(capsys, str(tmp_path / "text.txt"))
    assert code == 2 and err.startswith("flextrain: error: ") and "text.txt" in err
    code, _, err = inspect(capsys, str(tmp_path / "missing"))
    assert code == 2 and f"flextrain: error: directory not found: {tmp_path / 'missing'}" in err
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "notes.txt").write_text("hello")
    code, _, err = inspect(capsys, str(tmp_path / "e"))
    assert code == 2 and "holds no RecordIO files and no schema.json" in err
    assert os.listdir(tmp_path / "e") == ["notes.txt"]


def _damage(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_inspect_checks_every_chunk_of_every_shard(tmp_path, capsys):
    """Counting from chunk headers passed a shard whose payload was damaged; training then failed on it."""
    from flextrain.data import RecordIOReader, clear_reader_cache

    np.save(tmp_path / "x.npy", np.arange(400, dtype=np.int64))
    convert(tmp_path / "x.npy", tmp_path / "o", ConvertOptions(shard_size=100))
    out_dir = tmp_path / "o"
    # data-00002 in several chunks, its second one damaged; data-00003 cut short inside a chunk
    records = [np.int64(v).tobytes() for v in range(200, 300)]
    write_records(out_dir / "data-00002", records, max_chunk_size=200)
    second = RecordIOReader(out_dir / "data-00002").chunks[1].offset
    _damage(out_dir / "data-00002", second + 25)  # in its payload
    size = (out_dir / "data-00003").stat().st_size
    with open(out_dir / "data-00003", "r+b") as f:
        f.truncate(size - 3)
    clear_reader_cache()
    code, out, _ = inspect(capsys, str(out_dir), "--head", "1")
    assert code == 1, out
    assert "CORRUPT: 2 damaged chunks in 2 shards" in out
    assert f"{out_dir / 'data-00002'}: chunk at byte offset {second}: payload CRC-32 mismatch" in out
    assert f"{out_dir / 'data-00003'}: chunk at byte offset 0: chunk payload of" in out
    assert "record 0:" in out  # the rest is still shown
    code, out, _ = inspect(capsys, str(out_dir), "--json", "--head", "0")
    info = json.loads(out)
    assert code == 1 and info["verified"] is True
    assert [(c["name"], c["offset"]) for c in info["corrupt"]] == [("data-00002", second), ("data-00003", 0)]
    assert info["disagreements"] == []  # the truncated shard is reported as corrupt, not as a count
    # one file alone is checked the same way
    code, out, _ = inspect(capsys, str(out_dir / "data-00002"), "--head", "0")
    assert code == 1 and "CORRUPT: 1 damaged chunk in 1 shard" in out
    # --no-verify: the headers only, so the damaged payload passes unnoticed (the truncation does not)
    code, out, _ = inspect(capsys, str(out_dir), "--no-verify", "--json", "--head", "0")
    info = json.loads(out)
    assert code == 1 and info["verified"] is False and [c["name"] for c in info["corrupt"]] == ["data-00003"]
    (out_dir / "data-00003").unlink()
    convert(tmp_path / "x.npy", tmp_path / "o", ConvertOptions(shard_size=100, overwrite=True))
    write_records(out_dir / "data-00002", records, max_chunk_size=200)
    _damage(out_dir / "data-00002", second + 25)
    clear_reader_cache()
    code, out, _ = inspect(capsys, str(out_dir), "--no-verify", "--head", "0")
    assert code == 0 and "chunks not checked (--no-verify)" in out


def test_inspect_checks_one_chunk_at_a_time_with_progress(tmp_path):
    from flextrain.data.chunkcache import record_cache
    from flextrain.data.convert import inspect_dir

    np.save(tmp_path / "x.npy", np.arange(3000, dtype=np.int64))
    convert(tmp_path / "x.npy", tmp_path / "o", ConvertOptions(shard_size=1000))
    started, progress = [], []
    before = record_cache().stats()
    info = inspect_dir(tmp_path / "o", head=0, on_start=started.append, on_progress=progress.append)
    total = sum(f.stat().st_size for f in (tmp_path / "o").iterdir() if f.name.startswith("data-"))
    assert info["corrupt"] == [] and info["verified"] and started == [total] and sum(progress) == total
    assert len(progress) == 3  # a call per chunk (one chunk per shard here)
    after = record_cache().stats()  # the chunks checked bypass the record cache: none is looked up or kept
    assert (after.misses, after.entries) == (before.misses, before.entries)
