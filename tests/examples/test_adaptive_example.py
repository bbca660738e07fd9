"""examples/adaptive_batch.py: G grows with the noise scale as the loss falls; 2 ranks decide alike."""

from __future__ import annotations

import sys

import pytest

from test_elastic_examples import EXAMPLES, TORCHRUN, run

SCRIPT = EXAMPLES / "adaptive_batch.py"


def check_growing(result: dict, unit: int) -> None:
    sizes = [e["global_batch"] for e in result["epochs"]]
    assert sizes == sorted(sizes) and sizes[0] == 16 and sizes[-1] >= 256, result["epochs"]
    assert all(g % unit == 0 and 16 <= g <= 512 for _, g in result["history"])
    losses = [e["loss"] for e in result["epochs"]]
    assert losses[-1] < 0.7 * losses[0] and losses[-1] < 0.55, "near the label noise's floor (0.5)"
    fixed_steps = 6 * 4096 // 16
    assert result["steps"] < fixed_steps / 3, "far fewer steps than at the smallest G"
    assert result["lr"][0] == pytest.approx(0.005 * result["gain"], rel=1e-6) and result["gain"] > 4


def test_one_process_grows_the_batch_as_the_loss_falls():
    [result] = run([sys.executable, str(SCRIPT)])
    assert result["world_size"] == 1
    check_growing(result, 8)


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed beside this Python")
def test_two_processes_decide_alike():
    ranks = sorted(run([str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(SCRIPT)]), key=lambda r: r["rank"])
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)]
    assert ranks[0]["history"] == ranks[1]["history"] and len(ranks[0]["history"]) >= 3
    assert ranks[0]["checksum"] == ranks[1]["checksum"], "replicas in sync"
    check_growing(ranks[0], 16)
