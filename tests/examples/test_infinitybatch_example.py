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
