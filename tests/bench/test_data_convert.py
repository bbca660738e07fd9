"""bench/data_convert.py: one small run end to end prints one JSON object (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_a_small_run_prints_one_json_object():
    out = subprocess.run([sys.executable, str(BENCH / "data_convert.py"), "--rows", "300", "--cols", "3",
                          "--shard-size", "100", "--repeats", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["bench"] == "data_convert" and result["rows"] == 300
    assert set(result["sides"]) == {"baseline", "convert_w1", "convert_w2"}
    for side in result["sides"].values():
        assert side["records_per_s"] > 0 and side["mb_per_s"] > 0 and side["vs_baseline"] > 0
    assert result["w2_vs_w1"] > 0
