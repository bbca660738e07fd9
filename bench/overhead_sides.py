"""The sides ``bench/overhead.py`` compares: plain PyTorch loops and a 1-worker flextrain job.

Same model (``bench/models/mlp.py``), data, order, global batch, seed and torch threads on
every side; each side records ``time.perf_counter()`` after every optimizer step.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from flextrain.worker.backend import all_finite

from interleave import StepSeries

HERE = Path(__file__).resolve().parent
MODEL_FILE = HERE / "models" / "mlp.py"


def load_module(path: Path = MODEL_FILE):
    spec = importlib.util.spec_from_file_location("bench_mlp", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_data(out_dir: Path, mlp, *, records: int, files: int, seed: int) -> list[str]:
    """Synthetic classification data (labels from a noisy random linear teacher) as RecordIO files."""
    from flextrain.data import write_records

    rng = np.random.default_rng(seed)
    teacher = rng.standard_normal((mlp.FEATURES, mlp.CLASSES)).astype(np.float32)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    per_file = -(-records // files)
    for i in range(files):
        n = min(per_file, records - i * per_file)
        x = rng.standard_normal((n, mlp.FEATURES), dtype=np.float32)
        y = np.argmax(x @ teacher + 0.5 * rng.standard_normal((n, mlp.CLASSES), dtype=np.float32), axis=1)
        path = out_dir / f"part-{i:05d}.rio"
        write_records(path, mlp.encode(x, y))  # flextrain's defaults: Snappy, 32 MiB chunks
        paths.append(str(path))
    return paths


def step_sizes(file_sizes: list[int], batch: int, epochs: int) -> list[int]:
    """Samples of every optimizer step flextrain takes: tasks never cross files, a file's last
    batch may be short."""
    one = [min(batch, n - i) for n in file_sizes for i in range(0, n, batch)]
    return one * epochs


class PlainLoop:
    """A user's loop, one optimizer step per :meth:`step`, over the files in name order, again
    and again: over tensors ``feed``-ed once up front (``stream=False``: data held in memory),
    or reading and ``feed``-ing each step's records from the files as it goes (``stream=True``,
    with flextrain's reader). ``check``: after backward, the test every flextrain step makes of
    its gradients before applying them (``flextrain.worker.backend.all_finite``: no NaN or inf),
    so a side can price it apart from the rest of the framework."""

    def __init__(self, mlp, files: list[str], *, batch: int, seed: int, lr: float | None, stream: bool,
                 check: bool = False) -> None:
        from flextrain.data import open_reader

        self.mlp, self.stream, self.check = mlp, stream, check
        sizes = [len(open_reader(path)) for path in files]
        # In memory: contiguous tensors, the fastest a step can get its data.
        self.loaded = None if stream else [[t.contiguous() for t in mlp.feed(list(open_reader(p).read()), "training",
                                                                             None)] for p in files]
        self.as_batch = getattr(mlp, "record_batch", False)  # read as flextrain's worker reads for the module
        torch.manual_seed(seed)
        self.model = mlp.Model()
        self.optimizer = mlp.optimizer(self.model.parameters()) if lr is None \
            else mlp.optimizer(self.model.parameters(), lr=lr)
        self.series = StepSeries([], [])
        mlp.track_steps(self.optimizer, self.series.times)
        self.model.train()
        self._spans = itertools.cycle([(f, path, i, min(i + batch, n)) for f, (path, n) in
                                       enumerate(zip(files, sizes)) for i in range(0, n, batch)])
        self.loss_sum = 0.0

    def step(self) -> None:
        from flextrain.data import read_shard_range

        mlp = self.mlp
        f, path, i, j = next(self._spans)
        if self.stream:
            xb, yb = mlp.feed(read_shard_range(path, i, j, as_batch=self.as_batch), "training", None)
        else:
            xb, yb = self.loaded[f][0][i:j], self.loaded[f][1][i:j]
        self.optimizer.zero_grad()
        loss = mlp.loss(yb, self.model(xb))
        loss.backward()
        if self.check and not all_finite(p.grad for p in self.model.parameters() if p.grad is not None):
            raise FloatingPointError("a gradient is not finite")  # (flextrain would skip or fail the step)
        self.loss_sum += loss.item() * len(yb)
        self.optimizer.step()
        self.series.samples.append(len(yb))

    @property
    def mean_loss(self) -> float:
        return round(self.loss_sum / max(sum(self.series.samples), 1), 5)


def flextrain_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "flextrain"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("flextrain")
    return [found] if found else [sys.executable, "-m", "flextrain"]


def job_command(data_dir: Path, job_dir: Path, *, batch: int, epochs: int, seed: int,
                lr: float | None, extra: Sequence[str] = ()) -> list[str]:
    """``flextrain train`` of the bench module with one worker, into a fresh ``job_dir``;
    ``extra``: more ``flextrain train`` arguments (the bench's ``--job-arg``)."""
    if job_dir.exists():
        shutil.rmtree(job_dir)
    job_dir.mkdir(parents=True)
    cmd = flextrain_cmd() + [
        "train", "--model-def", f"{MODEL_FILE}:Model", "--training-data", str(data_dir),
        "--workers", "1", "--epochs", str(epochs), "--global-batch-size", str(batch),
        "--seed", str(seed), "--no-progress", "--job-dir", str(job_dir),
    ]
    return cmd + (["--lr", str(lr)] if lr is not None else []) + list(extra)


def step_times_file(job_dir: Path) -> Path:
    return job_dir / "step-times.json"


def finished_job(job_dir: Path, cmd: list[str], returncode: int, output: str) -> tuple[dict, list[float]]:
    """``(status.json, worker step times)`` of a job that succeeded; SystemExit with its output
    and logs otherwise."""
    times_file = step_times_file(job_dir)
    status_path = job_dir / "status.json"
    status = json.loads(status_path.read_text()) if status_path.exists() else {}
    if returncode != 0 or status.get("phase") != "Succeeded" or not times_file.exists():
        logs = "".join(p.read_text(errors="replace")[-2000:] for p in sorted((job_dir / "logs").glob("*")))
        raise SystemExit(
            f"flextrain run failed (exit {returncode}, phase {status.get('phase')}, step times "
            f"{'written' if times_file.exists() else 'missing'}): {' '.join(cmd)}\n{output[-4000:]}\n{logs}"
        )
    return status, json.loads(times_file.read_text())


def run_job(mlp, cmd: list[str], job_dir: Path) -> subprocess.Popen:
    """Start the job; its output goes to ``job_dir/output.txt`` (a pipe could fill while it is paused)."""
    env = {**os.environ, mlp.STEP_TIMES_ENV: str(step_times_file(job_dir))}  # the worker inherits it
    with open(job_dir / "output.txt", "wb") as out:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)


def job_output(job_dir: Path) -> str:
    path = job_dir / "output.txt"
    return path.read_text(errors="replace") if path.exists() else ""


def final_weights(job_dir: Path) -> dict:
    from flextrain.elastic.statecodec import decode

    return decode((job_dir / "checkpoints" / "final.ckpt").read_bytes())["model"]


class LoopProcess:
    """``bench/plain_loop.py`` as a child: one plain loop in a process of its own."""

    def __init__(self, mode: str, files: list[str], workdir: Path, *, name: str, batch: int, seed: int,
                 lr: float | None) -> None:
        self.name = name
        self.ready, self.out = workdir / f"{name}.ready", workdir / f"{name}.json"
        for stale in (self.ready, self.out):  # a previous run's (--repeats): not this process's
            stale.unlink(missing_ok=True)
        cmd = [sys.executable, str(HERE / "plain_loop.py"), "--mode", mode, "--batch", str(batch),
               "--seed", str(seed), "--ready", str(self.ready), "--out", str(self.out), *files]
        self.proc = subprocess.Popen(cmd + (["--lr", str(lr)] if lr is not None else []), stdin=subprocess.DEVNULL)

    def wait_ready(self, *, timeout: float = 600.0) -> None:
        """Until it has warmed up (a pass over the data) and steps on its own."""
        deadline = time.monotonic() + timeout
        while not self.ready.exists():
            if self.proc.poll() is not None:
                raise SystemExit(f"the {self.name} loop process (bench/plain_loop.py) exited with "
                                 f"{self.proc.returncode} before it was ready; its error is above")
            if time.monotonic() > deadline:
                raise SystemExit(f"the {self.name} loop process (bench/plain_loop.py) was not ready "
                                 f"after {timeout:.0f}s")
            time.sleep(0.05)

    def finish(self) -> tuple[StepSeries, float]:
        """Stop it (SIGTERM ends its current step) and return its step clock and mean loss."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            code = self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        if code != 0 or not self.out.exists():
            raise SystemExit(f"the {self.name} loop process failed (exit {code})")
        result = json.loads(self.out.read_text())
        return StepSeries(result["times"], result["samples"]), result["mean_loss"]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
