"""The elastic example scripts, run as a user runs them (one process, torchrun with 2), on small data."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TORCHRUN = Path(sys.executable).with_name("torchrun")


def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    return {**clean, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), clean.get("PYTHONPATH", "")])}


def run(cmd: list[str]) -> list[dict]:
    out = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    return json_objects(out.stdout)


def json_objects(stdout: str) -> list[dict]:
    """Every JSON object the processes printed. Under torchrun the ranks share one stdout and
    ``print`` writes the text and its newline separately, so two ranks' objects can meet on one
    line: each line is decoded object by object."""
    decoder, found = json.JSONDecoder(), []
    for line in stdout.splitlines():
        at = line.find("{")
        while line.startswith("{") and at != -1:
            obj, end = decoder.raw_decode(line, at)
            found.append(obj)
            at = line.find("{", end)
    return found


def single(*args: str) -> dict:
    [result] = run([sys.executable, str(EXAMPLES / "elastic_torch_single.py"), "--samples", "2048", *args])
    return result


def test_single_process_accumulates_and_steps_the_scheduler_per_real_step():
    result = single("--global-batch-size", "256", "--max-micro-batch", "64")
    assert (result["steps"], result["batch_sizes"], result["real_steps"]) == (4, [64] * 4, 3 * 8)
    assert result["lr"] == pytest.approx(0.1 * 0.5 ** (24 // 10))  # StepLR(10) over 24 real steps
    assert result["losses"][-1] < 0.6 * result["losses"][0]


@pytest.mark.parametrize("G", ["256", "250"])
def test_weighting_the_loss_with_scale_trains_the_same_model(G):
    plain = single("--global-batch-size", G, "--max-micro-batch", "64")
    scaled = single("--global-batch-size", G, "--max-micro-batch", "64", "--scale-loss")
    assert scaled["real_steps"] == plain["real_steps"]
    assert scaled["losses"] == pytest.approx(plain["losses"], rel=1e-5)
    assert scaled["checksum"] == pytest.approx(plain["checksum"], rel=1e-5, abs=1e-5)


def test_single_process_uneven_split():
    result = single("--global-batch-size", "250", "--max-micro-batch", "64")
    assert (result["steps"], result["batch_sizes"]) == (4, [63, 63, 62, 62])
    assert result["losses"][-1] < result["losses"][0]


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed beside this Python")
def test_ddp_under_torchrun_trains_as_one_process_does():
    """Same G: 2 processes x 2 micro-steps give the run of 1 process x 4 micro-steps."""
    ranks = run([str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(EXAMPLES / "elastic_torch_ddp.py"),
                 "--samples", "2048"])
    ranks.sort(key=lambda r: r["rank"])
    assert [(r["rank"], r["world_size"], r["steps"], r["batch_sizes"]) for r in ranks] == \
        [(0, 2, 2, [64, 64]), (1, 2, 2, [64, 64])]
    assert ranks[0]["checksum"] == ranks[1]["checksum"]  # replicas in sync
    alone = single("--global-batch-size", "256", "--max-micro-batch", "64")
    assert ranks[0]["real_steps"] == alone["real_steps"]
    assert ranks[0]["losses"] == pytest.approx(alone["losses"], rel=1e-4)
    assert ranks[0]["checksum"] == pytest.approx(alone["checksum"], rel=1e-4, abs=1e-4)


def test_the_aikit_script_differs_from_aikit_only_in_its_import():
    source = (EXAMPLES / "aikit_torch.py").read_text()
    tree = ast.parse(source)
    flextrain_imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and
                         (n.module or "").startswith("flextrain")]
    assert [(n.module, [a.name for a in n.names]) for n in flextrain_imports] == [("flextrain.compat", ["aikit"])]
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "flextrain"]
    [result] = run([sys.executable, str(EXAMPLES / "aikit_torch.py")])
    assert {k: result[k] for k in ("steps", "batch_size", "global_batch_size", "gpus", "master")} == \
        {"steps": 4, "batch_size": 64, "global_batch_size": 256, "gpus": 1, "master": True}
    assert result["losses"][-1] < 0.6 * result["losses"][0]


def test_the_aikit_keras_script_differs_from_aikit_only_in_its_import():
    tree = ast.parse((EXAMPLES / "aikit_keras.py").read_text())
    flextrain_imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and
                         (n.module or "").startswith("flextrain")]
    assert [(n.module, [a.name for a in n.names]) for n in flextrain_imports] == [("flextrain.compat", ["aikit"])]
    [result] = run([sys.executable, str(EXAMPLES / "aikit_keras.py")])
    assert (result["steps"], result["batch_size"], result["global_batch_size"], result["gpus"]) == (4, 64, 256, 1)
    assert result["updates"] == 3 * 1024 // 256  # one optimizer update per global batch
    assert result["losses"][-1] < result["losses"][0]
