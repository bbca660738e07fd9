"""Shared fixtures: the digits demo data, written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def digits_data(tmp_path_factory) -> Path:
    from flextrain.data.digits import write_digits

    out = tmp_path_factory.mktemp("digits")
    write_digits(out)
    return out
