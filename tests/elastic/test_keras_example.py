"""examples/elastic_keras.py runs as a script and trains with one update per global batch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

ROOT = Path(__file__).resolve().parents[2]


def test_the_keras_example_runs():
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "elastic_keras.py")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "4 accumulation step(s), loader batch 64 per process" in out
    assert "optimizer updates 12 (4 micro-batches of 64 each)" in out  # 3 epochs x 1024 / 256
    losses = [float(v) for v in re.findall(r"epoch \d: loss ([0-9.]+)", out)]
    final = float(re.search(r"final loss ([0-9.]+)", out).group(1))
    assert len(losses) == 3 and losses[-1] == final and final < losses[0]
