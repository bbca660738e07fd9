"""The examples run as a user runs them. examples/accelerate_semi_auto.py (ATorch's semi-automatic
example, only the import changed): one process with a strategy from flags, again from the strategy
it saved, and under torchrun with 2 processes and fsdp2. examples/accelerate_auto.py (the fully
automatic mode): the search with every method the CPU allows, the pick saved and reloaded, and
under torchrun with 2 processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flextrain.accelerate import Strategy

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


AUTO_EXAMPLE = ROOT / "examples" / "accelerate_auto.py"


def run_auto(*args: str, torchrun: bool = False) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2"] if torchrun else [sys.executable]
    out = subprocess.run([*cmd, str(AUTO_EXAMPLE), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    [line] = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    return line, out.stdout


def test_fully_automatic_example_searches_prints_the_table_and_saves_the_pick(tmp_path):
    """With every method the CPU allows, torch.compile included (dynamo is reset between candidates)."""
    from flextrain.accelerate import get

    saved = tmp_path / "auto.json"
    result, stdout = run_auto("--save_strategy_to_file", str(saved))
    search = result["search"]
    assert "auto_accelerate search" in stdout and "samples/s" in stdout and "picked" in stdout
    assert search["elapsed"] < search["time_limit"] == 300 and not search["stopped_early"]
    rows = search["rows"]
    assert rows[0]["label"] == "plain" and rows[0]["runs"] == 2
    accepted = [r for r in rows if r["status"] in ("accepted", "picked")]
    [picked] = [r for r in rows if r["status"] == "picked"]
    assert picked["samples_per_second"] == max(r["samples_per_second"] for r in accepted)
    assert picked["methods"] == result["strategy"]
    labels = {r["label"] for r in rows}
    assert {"channels_last", "amp_native(bf16)", "half(bf16)"} <= labels
    if get("native_dynamo").check(None, torch.device("cpu"), None) is None:  # a C++ compiler for inductor
        [compiled] = [r for r in rows if r["label"] == "native_dynamo"]
        assert compiled["status"] in ("accepted", "rejected") and compiled["runs"] >= 1
    assert result["steps"] == 2 * 16 and result["last_loss"] < 0.5 * result["first_loss"]
    assert Strategy.load(str(saved)).names == tuple(result["strategy"])
    again, _ = run_auto("--load_strategy_file", str(saved), "--epoch", "1", "--save_strategy_to_file",
                        str(tmp_path / "again.json"))
    assert again["strategy"] == result["strategy"] and again["search"] is None
    assert Strategy.load(str(tmp_path / "again.json")) == Strategy.load(str(saved))


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed beside this Python")
def test_fully_automatic_example_with_two_processes(tmp_path):
    result, _ = run_auto("--excluded", "native_dynamo", "--epoch", "1", "--save_strategy_to_file",
                         str(tmp_path / "auto.json"), torchrun=True)
    assert result["strategy"][0] == "parallel_mode" and result["loader_batch"] == 32
    assert result["search"]["rows"][0]["label"] == "parallel_mode"
