"""Helpers of the bad-input suite: a model-zoo module with one thing broken, and where its line is."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ft_helpers import MODEL_ZOO, flextrain_cmd

DIGITS_TORCH = (MODEL_ZOO / "digits_torch.py").read_text()
# Prepended by cases that break the module only where the workers run it (preflight passes).
IN_WORKER = 'import os\nIN_WORKER = bool(os.environ.get("FLEXTRAIN_WORKER_ID"))\n'


def module(tmp_path: Path, name: str, replace: dict[str, str], *, source: str = DIGITS_TORCH) -> Path:
    """``source`` with each ``old`` replaced by ``new`` (each must be there), written as ``name.py``."""
    for old, new in replace.items():
        assert old in source, old
        source = source.replace(old, new)
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return path


def line_of(path: Path, text: str) -> int:
    """The line number of ``text`` in ``path`` (the user's line a message must point at)."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def run_without_dac_override(*args: str) -> subprocess.CompletedProcess:
    """``flextrain ARGS`` without the capabilities that let root read and write through file modes
    (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH): a permission error is then real for root too."""
    if shutil.which("setpriv") is None:
        pytest.skip("root reads and writes through file modes and setpriv (util-linux) is not installed")
    drop = "-dac_override,-dac_read_search"
    return subprocess.run(["setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}", *flextrain_cmd(*args)],
                          capture_output=True, text=True, timeout=120)
