"""examples/accelerate_semi_auto.py (ATorch's semi-automatic example, only the import changed) runs as
a user runs it: one process with a strategy from flags, again from the strategy it saved, and
under torchrun with 2 processes and fsdp2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "accelerate_semi_auto.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")


def run(*args: str, torchrun: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2"] if torchrun else [sys.executable]
    out = subprocess.run([*cmd, str(EXAMPLE), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    [line] = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    return line


def test_semi_automatic_example_with_a_saved_strategy(tmp_path):
    saved = tmp_path / "strategy.json"
    first = run("--use_amp", "--use_checkpointing", "--use_module_replace", "--save_strategy_to_file", str(saved))
    assert first["strategy"] == ["module_replace", "amp_native", "checkpoint"] and not first["skipped"]
    assert "module_replace: replaced MultiheadAttention_SDPA x2" in first["notes"]
    assert first["steps"] == 3 * 16 and first["last_loss"] < 0.2 * first["first_loss"]
    methods = json.loads(saved.read_text())["methods"]
    assert methods[2]["config"]["wrap_class"] == [{"__class__": "__main__:DecoderBlock"}]
    again = run("--load_strategy_file", str(saved), "--epoch", "1")
    assert again["strategy"] == first["strategy"] and again["first_loss"] == first["first_loss"]


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed beside this Python")
def test_semi_automatic_example_with_two_processes_and_fsdp2():
    result = run("--distributed", "--use_fsdp", "--use_amp", "--optim_grouped_params", torchrun=True)
    assert result["strategy"] == ["parallel_mode", "fsdp2", "amp_native"]
    assert result["loader_batch"] == 16  # the global batch of 32 over 2 processes
    assert result["last_loss"] < 0.2 * result["first_loss"]
