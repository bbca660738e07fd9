"""examples/infinitybatch_readme.py: infinitybatch's three README use cases, only the import changed."""

from __future__ import annotations

import json
import subprocess
import sys

from test_elastic_examples import EXAMPLES, ROOT, env


def test_the_three_readme_use_cases_run_as_written():
    out = subprocess.run([sys.executable, str(EXAMPLES / "infinitybatch_readme.py")], cwd=ROOT, capture_output=True,
                         env={**env(), "EPOCHS": "3", "FLEXTRAIN_MAX_MICRO_BATCH": "128"}, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr
    results = {r["use_case"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert set(results) == {"simple_use_case", "epoch_use_case", "custom_use_case"}
    for r in results.values():
        assert r["steps"] == 3 * 4 and r["micro_batch_size"] == 128  # 4 batches of 512 per epoch
    for name in ("simple_use_case", "epoch_use_case"):
        assert results[name]["epochs"] == 3 and results[name]["last_loss"] < results[name]["first_loss"]
    # the same model, data order and updates: the three loops end alike
    accuracies = [r["accuracy"] for r in results.values()]
    assert max(accuracies) - min(accuracies) < 0.05, results


def test_the_flextrain_api_example_trains_on_a_memory_budget(tmp_path):
    out = subprocess.run([sys.executable, str(EXAMPLES / "infinity_batch.py"), "--history", str(tmp_path / "h.json")],
                         cwd=ROOT, capture_output=True, env=env(), text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    assert "parameters: 9,930 (9,930 trainable, 0 frozen)" in out.stdout  # the summary
    result = json.loads(out.stdout.splitlines()[-1])
    assert 0.9 * 256 <= result["micro_batch_size"] <= 256  # the budget is what 256 samples need
    assert result["epochs"] == list(range(8)) and result["steps"] == 8 * 4  # callbacks; 4 batches of 2048
    assert result["losses"][-1] < 0.8 * result["losses"][0] and result["eval"]["accuracy"] > 0.5
    assert [h["epoch"] for h in json.loads((tmp_path / "h.json").read_text())] == list(range(8))
