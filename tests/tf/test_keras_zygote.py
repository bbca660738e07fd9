"""A Keras job's workers fork from a zygote that has imported TensorFlow (flextrain/zygote.py's
``preload``, asked for once preflight has named the module's framework): each worker finds TensorFlow
loaded instead of importing it itself (~6-8 s of CPU here), and trains as a fresh process would; the
training process itself imports neither the module nor TensorFlow (preflight checked the module). A module
whose source imports TensorFlow at its top level has it preloaded at once, for preflight too."""

from __future__ import annotations

import json
import textwrap

import pytest

from ft_helpers import MODEL_ZOO, read_status, run_flextrain

pytestmark = pytest.mark.e2e

# The zoo's Keras digits module, plus a mark per process that imports it: its parent's command line and
# whether TensorFlow was loaded before the module imported it. {header}: what its source imports at the top
MARKING_KERAS = textwrap.dedent("""
    import importlib.util, json, os, sys
    _loaded = "tensorflow" in sys.modules
    {header}
    _spec = importlib.util.spec_from_file_location("digits_keras", {digits!r})
    _digits = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_digits)
    globals().update({{k: v for k, v in vars(_digits).items() if not k.startswith("_")}})
    with open(os.path.join({marks!r}, str(os.getpid())), "w") as _mark:
        json.dump({{"parent": open(f"/proc/{{os.getppid()}}/cmdline").read(), "loaded": _loaded,
                   "worker": os.environ.get("FLEXTRAIN_WORKER_ID")}}, _mark)
""")


@pytest.mark.parametrize("header", ["import tensorflow as tf", "pass"], ids=["imported-at-the-top", "hidden"])
def test_a_keras_jobs_workers_fork_with_tensorflow_loaded(digits_examples, tmp_path, header):
    marks = tmp_path / "marks"
    marks.mkdir()
    module = tmp_path / "marking_keras.py"
    module.write_text(MARKING_KERAS.format(digits=str(MODEL_ZOO / "digits_keras.py"), marks=str(marks), header=header))
    job_dir = tmp_path / "job"
    done = run_flextrain("train", "--model-def", f"{module}:custom_model", "--training-data",
                         str(digits_examples / "train"), "--workers", "2", "--epochs", "1", "--global-batch-size",
                         "64", "--lr", "0.1", "--job-dir", str(job_dir), "--no-progress", timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_status(job_dir)["phase"] == "Succeeded"
    seen = [json.loads(m.read_text()) for m in marks.iterdir()]
    workers = [s for s in seen if s["worker"]]
    assert sorted(s["worker"] for s in workers) == ["worker-0", "worker-1"], seen
    assert all("flextrain.zygote" in s["parent"] and s["loaded"] for s in workers), seen  # forked, TF there
    # preflight imported it too, forked: with TensorFlow loaded where the source shows it imports it, else
    # before preflight named the framework. The training process itself imported neither (preflight checked).
    others = [s for s in seen if not s["worker"]]
    assert len(others) == 1 and "flextrain.zygote" in others[0]["parent"], seen
    assert others[0]["loaded"] == header.startswith("import tensorflow"), seen
