"""The elastic-learning-rate-evaluation (vbs) script on digits: one process, and torchrun with 2."""

from __future__ import annotations

import ast
import sys

import pytest

from flextrain.elastic.torch import TraceBatchSampler
from test_elastic_examples import EXAMPLES, TORCHRUN, run

SCRIPT = EXAMPLES / "vbs_mnist_style.py"
TRACE = [32] * 30 + [64] * 20 + [128] * 10 + [256]  # as the script writes it


def test_the_script_imports_flextrain_only_as_vbs():
    tree = ast.parse(SCRIPT.read_text())
    imports = [(a.name, a.asname) for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
               if a.name.startswith("flextrain")]
    assert imports == [("flextrain.compat.vbs", "vbs")]
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("flextrain")]


def one_process() -> dict:
    [result] = run([sys.executable, str(SCRIPT)])
    return result


def test_one_process_trains_through_the_trace():
    result = one_process()
    layout = TraceBatchSampler(1500, TRACE, 1, 0, minibatch_size=16)
    # 10 epochs of 1500 samples; steps count across epochs; each epoch past the trace ends with a
    # partial step of 1500 - 5 x 256 = 220 samples, whose linear-rule LR is 0.1 x 220/128
    assert result["world_size"] == 1 and result["steps"] == result["real_steps"] == layout.first_step(10)
    assert result["last_batch"] == 220 and result["lr"] == pytest.approx([0.1 * 220 / 128])
    assert result["test_loss"][-1] < 0.6 * result["test_loss"][0]
    assert result["accuracy"][-1] > 50.0


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed beside this Python")
def test_two_processes_under_torchrun_train_as_one_process_does():
    ranks = sorted(run([str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(SCRIPT)]),
                   key=lambda r: r["rank"])
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)]
    assert ranks[0]["checksum"] == ranks[1]["checksum"], "replicas in sync"
    alone = one_process()
    assert ranks[0]["steps"] == alone["steps"] and ranks[0]["lr"] == pytest.approx(alone["lr"])
    # float32, summed in another order: close, not bit-equal
    assert ranks[0]["test_loss"] == pytest.approx(alone["test_loss"], rel=2e-2)
    assert ranks[0]["checksum"] == pytest.approx(alone["checksum"], rel=1e-2)
