"""bench/accelerate.py: its pairing of two sides, and one tiny run end to end (the JSON's shape; no
timing asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from accelerate import against  # noqa: E402


def test_a_side_is_paired_with_the_blocks_of_any_other_side_around_it():
    series = [("hand", 10.0), ("a", 20.0), ("b", 10.0), ("hand", 10.0), ("a", 22.0), ("b", 11.0)]
    assert against(series, "a", "b") == [pytest.approx(2.0), pytest.approx(22 / 10.5)]  # 20/10, 22/mean(10, 11)
    assert against(series, "plain", "b") == [pytest.approx(1.0), pytest.approx(10 / 10.5)]  # plain is "hand"
    assert against(series, "a", "plain") == [pytest.approx(2.0), pytest.approx(2.2)]


def test_a_tiny_run_prints_one_json_object():
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    out = subprocess.run([sys.executable, str(BENCH / "accelerate.py"), "--rounds", "2", "--cnn-block", "1",
                          "--mlp-block", "1", "--warmup", "1", "--batch", "8", "--hidden", "16", "--features", "8",
                          "--time-limit", "30", "--excluded", "native_dynamo"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["bench"] == "accelerate" and set(result["models"]) == {"cnn", "mlp"}
    assert result["excluded"] == ["native_dynamo"] and isinstance(result["met"], bool)
    for name, model in result["models"].items():
        search = model["search"]
        assert 0 < search["seconds"] <= search["call_seconds"] and search["time_limit"] == 30
        assert search["table"][0]["label"] == "plain" and search["candidates"] == len(search["table"])
        sides = model["sides"]
        assert {"plain", "amp_native(bf16)", "half(bf16)"} <= set(sides)
        assert ("channels_last" in sides) == (name == "cnn")  # only a conv net has it
        assert "amp_native(bf16) + half(bf16)" not in sides  # one precision method at most
        auto, control = sides[model["auto_side"]], sides["control (auto's pick, a second copy)"]
        assert auto["methods"] == control["methods"] == search["pick_methods"]
        for label, side in sides.items():
            assert side["samples_per_s"] > 0
            if label != "plain":
                assert side["vs_plain"] > 0 and len(side["vs_plain_ci95"]) == 2
        assert model["best_hand_picked"] in sides and model["auto_vs_best"] > 0
        assert len(model["auto_vs_best_ci95"]) == 2
        assert model["control_vs_auto"] > 0 and len(model["control_vs_auto_ci95"]) == 2
