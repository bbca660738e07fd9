"""flextrain.durable.write_atomic: whole or not at all, the old file kept on failure, no temp left."""

import os

import pytest

from flextrain.durable import write_atomic


def test_writes_and_replaces(tmp_path):
    path = tmp_path / "state.bin"
    write_atomic(path, b"first")
    write_atomic(path, memoryview(bytearray(b"second, longer")))
    assert path.read_bytes() == b"second, longer"
    assert os.listdir(tmp_path) == ["state.bin"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "state.bin"
    write_atomic(path, b"old")

    def no_space(fd, data):  # what a full disk does to write(2)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", no_space)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, b"new")
    monkeypatch.undo()
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["state.bin"]


def test_large_writes_are_complete(tmp_path):
    data = os.urandom(3 << 20)
    write_atomic(tmp_path / "big", data)
    assert (tmp_path / "big").read_bytes() == data
