"""Fixtures for the data-layer tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from rio_refdata import TESTDATA

from flextrain.data import clear_reader_cache


@pytest.fixture
def copy_reference(tmp_path):
    """Copy a reference RecordIO file into tmp_path (for tests that damage it)."""

    def _copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copyfile(TESTDATA / name, dst)
        return dst

    return _copy


@pytest.fixture(autouse=True)
def _fresh_reader_cache():
    # open_reader caches readers process-wide; keep tests independent.
    clear_reader_cache()
    yield
    clear_reader_cache()
