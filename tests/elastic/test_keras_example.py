"""Scripts in their own processes: examples/elastic_keras.py, and a tf.distribute world (device setup is per process)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

ROOT = Path(__file__).resolve().parents[2]


def test_the_keras_example_runs():
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "elastic_keras.py")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "4 accumulation step(s), loader batch 64 per process" in out
    assert "optimizer updates 12 (4 micro-batches of 64 each)" in out  # 3 epochs x 1024 / 256
    losses = [float(v) for v in re.findall(r"epoch \d: loss ([0-9.]+)", out)]
    final = float(re.search(r"final loss ([0-9.]+)", out).group(1))
    assert len(losses) == 3 and losses[-1] == final and final < losses[0]


MIRRORED = """
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import flextrain.elastic.keras as elastic
with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
    s = elastic.init(256, 64)
    print("plan", s.world_size, s.steps, s.batch_size)
    model = elastic.Model(tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)]))
    try:
        model.compile(optimizer="sgd", loss="mse")
    except elastic.ElasticInitError as e:
        print("refused:", e)
"""


def test_accumulation_under_a_mirrored_strategy_is_refused_clearly():
    """Keras 3.15's own accumulation breaks under tf.distribute: say so at compile, not deep in fit."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    done = subprocess.run([sys.executable, "-c", MIRRORED], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "plan 2 2 128" in done.stdout  # two replicas: 2 steps, each of 2 x 64
    assert "refused: Model.compile: accumulating 2 steps under a tf.distribute strategy of 2 replicas" in done.stdout
