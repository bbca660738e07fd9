"""bench/tls.py: a small run end to end prints one JSON object (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_a_small_run_compares_a_tls_ps_with_a_plaintext_one():
    out = subprocess.run([sys.executable, str(BENCH / "tls.py"), "--mb", "2", "--emb-ids", "5000", "--repeats", "2"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["bench"] == "tls" and result["config"]["repeats"] == 2
    for kind in ("dense", "embedding"):
        low, high = result[kind]["ci95"]
        assert 0 < low <= result[kind]["tls_vs_plain"] <= high and result[kind]["tls_MBps"] > 0
