"""flextrain overhead benchmark: a 1-worker flextrain job vs. a plain PyTorch loop.

Runs the same model (``bench/models/mlp.py``: 256 -> 1024 -> 1024 -> 10 MLP,
SGD with momentum) on the same synthetic RecordIO data, with the same global
batch, the same number of optimizer steps and the same number of torch threads
as

  (a) a plain PyTorch loop, in this process: the records are read once with
      flextrain's RecordIO reader and turned into tensors with the module's
      ``feed`` (what a user with an in-memory data set writes), then
      ``zero_grad / forward / loss / backward / step`` per batch;
  (b) ``flextrain train --workers 1 --no-progress ...`` as a subprocess.

Throughput is measured by difference (see METHOD below): each side runs at two
step counts (``--epochs-short`` and ``--epochs-long``) and the rate is
``(samples_long - samples_short) / (time_long - time_short)`` over its training
window -- for flextrain from the worker's "round 0" log line to the mtime of
its final checkpoint, so process start-up, torch import and rendezvous are
outside, and first-step warm-up and the checkpoint write cancel. Everything
per step (for flextrain also reading and decoding each step's records, the
task RPCs, heartbeats) stays in. Each measurement is repeated ``--repeats``
times, plain and flextrain alternating, and the medians are reported. The
final weights of both long runs are compared as a check that both did the
same work (``runs.final_weights_max_abs_diff``).

Usage (from the repository root):

    .venv/bin/python bench/overhead.py            # ~2.5 min on 2 cores
    .venv/bin/python bench/overhead.py --repeats 1 --epochs-long 2   # quick

stdout: exactly one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
MODEL_FILE = HERE / "models" / "mlp.py"
TARGET_RATIO = 0.97

METHOD = (
    "difference of two step counts: each side runs epochs_short and epochs_long and "
    "samples/s = (samples_long - samples_short) / (train_seconds_long - train_seconds_short), so fixed "
    "costs (first-step warm-up, final checkpoint) cancel and only per-step costs remain. "
    "flextrain train_seconds: from the worker's 'round 0' log line (process started, torch imported, "
    "module loaded, model built, rendezvous done) to the mtime of checkpoints/final.ckpt (written after "
    "the last step): per-step record reads + feed, task RPCs, heartbeats and the master's work are "
    "inside. plain train_seconds: in-process, from model+optimizer built to the last step of a "
    "straightforward zero_grad/forward/loss/backward/step/loss.item() loop over tensors pre-loaded "
    "once (before the window) with flextrain's RecordIO reader and the module's feed, as a user with an "
    "in-memory data set would; so flextrain's per-step data reading counts as overhead. "
    "Same module, data order (files in name order, sequential batches, no shuffle), global batch "
    "(no accumulation), seed, step count and torch threads (flextrain gives a lone worker cpu_count "
    "threads). Repeated with plain and flextrain alternating; medians reported, ratio = median "
    "flextrain / median plain. runs.wall_*: the same difference over whole-process wall times "
    "(noisier: start-up varies by seconds). other_cpu_cores: CPU used by other processes during a run."
)


def log(msg: str) -> None:
    print(f"[overhead] {msg}", file=sys.stderr, flush=True)


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location("bench_mlp", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- data -------------------------------------------------------------------
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


def samples_for(file_sizes: list[int], batch: int, epochs: int) -> int:
    return epochs * sum(file_sizes)


def steps_for(file_sizes: list[int], batch: int, epochs: int) -> int:
    """Optimizer steps flextrain takes: tasks never cross files, a file's last batch may be short."""
    return epochs * sum(-(-n // batch) for n in file_sizes)


# ---- (a) the plain PyTorch loop --------------------------------------------------
def plain_run(mlp, files: list[str], *, batch: int, epochs: int, seed: int, lr: float | None):
    """A user's loop. ``seconds``: data load + training; ``train_seconds``: model built .. last step."""
    from flextrain.data import open_reader

    t0 = time.perf_counter()
    features, labels = [], []
    for path in files:  # the same files, in the same order, as flextrain's shards
        records = list(open_reader(path).read())
        x, y = mlp.feed(records, "training", None)
        features.append(x)
        labels.append(y)
    torch.manual_seed(seed)
    model = mlp.Model()
    optimizer = mlp.optimizer(model.parameters()) if lr is None else mlp.optimizer(model.parameters(), lr=lr)
    model.train()
    t_train = time.perf_counter()  # the counterpart of the worker's "round 0" log line
    steps = samples = 0
    loss_sum = 0.0
    for _ in range(epochs):
        for x, y in zip(features, labels):
            for i in range(0, len(y), batch):
                xb, yb = x[i : i + batch], y[i : i + batch]
                optimizer.zero_grad()
                loss = mlp.loss(yb, model(xb))
                loss.backward()
                optimizer.step()
                loss_sum += loss.item() * len(yb)
                steps += 1
                samples += len(yb)
    t1 = time.perf_counter()
    return {"seconds": t1 - t0, "train_seconds": t1 - t_train, "steps": steps, "samples": samples,
            "model": model, "mean_loss": loss_sum / max(samples, 1)}


# ---- (b) flextrain------------------------------------------------------------------
def flextrain_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "flextrain"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("flextrain")
    return [found] if found else [sys.executable, "-m", "flextrain"]


_ROUND_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) flextrain\.worker INFO round 0: rank 0 of 1 ")


def worker_train_window(job_dir: Path) -> float | None:
    """Seconds from the worker's "round 0" log line (model built, rendezvous done, about to ask
    for its first task) to the mtime of checkpoints/final.ckpt (written right after the last
    step). None if either is missing (e.g. the log format changed)."""
    ckpt = job_dir / "checkpoints" / "final.ckpt"
    logs = sorted((job_dir / "logs").glob("worker-*.log"))
    if not ckpt.exists() or len(logs) != 1:
        return None
    for line in logs[0].read_text(errors="replace").splitlines():
        m = _ROUND_LINE.match(line)
        if m:
            start = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
            return ckpt.stat().st_mtime_ns / 1e9 - start
    return None


def flextrain_run(data_dir: Path, job_dir: Path, *, batch: int, epochs: int, seed: int, lr: float | None):
    if job_dir.exists():
        shutil.rmtree(job_dir)
    cmd = flextrain_cmd() + [
        "train", "--model-def", f"{MODEL_FILE}:Model", "--training-data", str(data_dir),
        "--workers", "1", "--epochs", str(epochs), "--global-batch-size", str(batch),
        "--seed", str(seed), "--no-progress", "--job-dir", str(job_dir),
    ]
    if lr is not None:
        cmd += ["--lr", str(lr)]
    # INFO lets the worker log its round start (one line per round): the start of the train window.
    env = {**os.environ, "FLEXTRAIN_LOG_LEVEL": "INFO"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    status_path = job_dir / "status.json"
    status = json.loads(status_path.read_text()) if status_path.exists() else {}
    if proc.returncode != 0 or status.get("phase") != "Succeeded":
        logs = "".join(p.read_text(errors="replace")[-2000:] for p in sorted((job_dir / "logs").glob("*")))
        raise SystemExit(
            f"flextrain run failed (exit {proc.returncode}, phase {status.get('phase')}): "
            f"{' '.join(cmd)}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}\n{logs}"
        )
    return {"seconds": seconds, "train_seconds": worker_train_window(job_dir), "steps": int(status.get("step", -1)),
            "status": status}


def final_weights(job_dir: Path) -> dict:
    from flextrain.elastic.statecodec import decode

    return decode((job_dir / "checkpoints" / "final.ckpt").read_bytes())["model"]


# ---- interference ---------------------------------------------------------------------------
class CPUMeter:
    """CPU seconds the rest of the machine burned while we measured (other users' tests...).

    busy time from /proc/stat minus this process's and its waited-for children's CPU time.
    """

    def __init__(self) -> None:
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _sample(self):
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except OSError:
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        t = os.times()
        return (sum(fields) - idle) / self.tick, t.user + t.system + t.children_user + t.children_system

    def __enter__(self):
        self.start = self._sample()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        end = self._sample()
        wall = time.perf_counter() - self.t0
        if self.start is None or end is None or wall <= 0:
            self.other_cores = None
            return
        other = (end[0] - self.start[0]) - (end[1] - self.start[1])
        self.other_cores = max(0.0, other / wall)  # average cores busy with other processes


def wait_until_quiet(max_other: float, timeout: float, interval: float = 0.5) -> float:
    """Wait (at most ``timeout`` s) until other processes use <= ``max_other`` cores; returns seconds waited."""
    t0 = time.perf_counter()
    announced = False
    while True:
        with CPUMeter() as m:
            time.sleep(interval)
        waited = time.perf_counter() - t0
        if m.other_cores is None or m.other_cores <= max_other or waited >= timeout:
            return waited - interval
        if not announced:
            log(f"  other processes use {m.other_cores:.2f} cores; waiting up to {timeout:.0f}s for a quiet CPU")
            announced = True


# ---- main -------------------------------------------------------------------------------
def rate(short: dict, long: dict, key: str) -> float | None:
    if short.get(key) is None or long.get(key) is None or long[key] <= short[key]:
        return None
    return (long["samples"] - short["samples"]) / (long[key] - short[key])


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=32768, help="training records (1028 bytes each)")
    p.add_argument("--files", type=int, default=4, help="RecordIO files (shards) the records are spread over")
    p.add_argument("--global-batch-size", type=int, default=256)
    p.add_argument("--epochs-short", type=int, default=1)
    p.add_argument("--epochs-long", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the module's)")
    p.add_argument("--max-other-cpu", type=float, default=0.1,
                   help="a run during which other processes used more CPU cores than this (on average) is repeated")
    p.add_argument("--retries", type=int, default=2, help="repeats of a run disturbed by other processes")
    p.add_argument("--quiet-wait", type=float, default=20.0,
                   help="seconds to wait at most, before each run, for other processes to leave the CPU idle")
    p.add_argument("--workdir", help="keep data and job dirs here instead of a temp dir")
    args = p.parse_args(argv)
    if not 0 < args.epochs_short < args.epochs_long:
        p.error("need 0 < --epochs-short < --epochs-long")

    # flextrain's local backend gives its workers cpu_count // max_workers threads
    # (flextrain/master/main.py); with one worker that is every core. Match it.
    threads = max(1, os.cpu_count() or 1)
    torch.set_num_threads(threads)
    mlp = load_module(MODEL_FILE)
    G = args.global_batch_size

    tmp = None
    if args.workdir:
        root = Path(args.workdir).resolve()
        root.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="flextrain-bench-")
        root = Path(tmp.name)
    try:
        data_dir = root / "train"
        t0 = time.perf_counter()
        files = write_data(data_dir, mlp, records=args.records, files=args.files, seed=args.seed)
        from flextrain.data import make_shards

        sizes = [s.size for s in make_shards(data_dir)]
        short_steps = steps_for(sizes, G, args.epochs_short)
        long_steps = steps_for(sizes, G, args.epochs_long)
        log(f"wrote {sum(sizes)} records in {len(files)} files to {data_dir} ({time.perf_counter() - t0:.1f}s); "
            f"G={G}, threads={threads}, steps {short_steps}/{long_steps}, repeats {args.repeats}")
        # Warm-up (discarded): first-call costs of torch and of the reader in this process.
        plain_run(mlp, files, batch=G, epochs=1, seed=args.seed, lr=args.lr)

        runs = {"plain": [], "flextrain": [], "per_repeat": [], "discarded": []}
        plain_model = None
        busy_runs = 0
        for r in range(args.repeats):
            order = (args.epochs_short, args.epochs_long) if r % 2 == 0 else (args.epochs_long, args.epochs_short)
            got = {"plain": {}, "flextrain": {}}
            for epochs in order:
                expected = steps_for(sizes, G, epochs)

                def run_plain():
                    res = plain_run(mlp, files, batch=G, epochs=epochs, seed=args.seed, lr=args.lr)
                    return res, {"seconds": round(res["seconds"], 4), "train_seconds": round(res["train_seconds"], 4),
                                 "mean_loss": round(res["mean_loss"], 5)}

                def run_flextrain():
                    res = flextrain_run(root / "train", root / f"job-e{epochs}", batch=G, epochs=epochs,
                                        seed=args.seed, lr=args.lr)
                    train = res["train_seconds"]
                    return res, {"seconds": round(res["seconds"], 4),
                                 "train_seconds": None if train is None else round(train, 4),
                                 "last_loss": res["status"].get("metrics", {}).get("loss")}

                for name, fn in (("plain", run_plain), ("flextrain", run_flextrain)):
                    for attempt in range(args.retries + 1):
                        waited = wait_until_quiet(args.max_other_cpu, args.quiet_wait)
                        with CPUMeter() as meter:
                            res, rec = fn()
                        if res["steps"] != expected:
                            raise SystemExit(f"{name} took {res['steps']} steps, expected {expected}")
                        rec = {"repeat": r, "epochs": epochs, "steps": res["steps"],
                               "samples": samples_for(sizes, G, epochs), **rec,
                               "other_cpu_cores": None if meter.other_cores is None else round(meter.other_cores, 3),
                               "attempt": attempt,
                               "waited_for_quiet_s": round(waited, 1)}
                        busy = meter.other_cores is not None and meter.other_cores > args.max_other_cpu
                        train = rec["train_seconds"] if rec["train_seconds"] is not None else float("nan")
                        log(f"repeat {r} {name:<9} steps={rec['steps']:4d} wall {rec['seconds']:7.2f}s "
                            f"train {train:7.2f}s"
                            + (f"  other processes used {meter.other_cores:.2f} cores meanwhile" if busy else ""))
                        if not busy:
                            break
                        if attempt < args.retries:
                            runs["discarded"].append({"name": name, **rec})
                            log("  ... interference: discarding and repeating this run")
                        else:
                            busy_runs += 1
                            rec["interference"] = True
                    runs[name].append(rec)
                    got[name][epochs] = rec
                    if name == "plain" and epochs == args.epochs_long:
                        plain_model = res["model"]
            s_, l_ = args.epochs_short, args.epochs_long
            per = {"repeat": r}
            for name in ("plain", "flextrain"):
                per[f"{name}_samples_per_s"] = rate(got[name][s_], got[name][l_], "train_seconds")
                per[f"{name}_wall_samples_per_s"] = rate(got[name][s_], got[name][l_], "seconds")
            pr, fr = per["plain_samples_per_s"], per["flextrain_samples_per_s"]
            per["ratio"] = fr / pr if pr and fr else None
            pw, fw = per["plain_wall_samples_per_s"], per["flextrain_wall_samples_per_s"]
            per["wall_ratio"] = fw / pw if pw and fw else None
            runs["per_repeat"].append({k: (round(v, 4) if isinstance(v, float) else v) for k, v in per.items()})
            log(f"repeat {r}: plain {pr or float('nan'):.0f} samples/s, flextrain {fr or float('nan'):.0f} samples/s, "
                f"ratio {per['ratio'] or float('nan'):.4f} (by wall time: {per['wall_ratio'] or float('nan'):.4f})")

        per = runs["per_repeat"]
        plain = median(x["plain_samples_per_s"] for x in per)
        flex = median(x["flextrain_samples_per_s"] for x in per)
        method = METHOD
        if flex is None:  # no train windows (worker log format changed?): fall back to wall times
            plain = median(x["plain_wall_samples_per_s"] for x in per)
            flex = median(x["flextrain_wall_samples_per_s"] for x in per)
            method = "FALLBACK (no worker train window found): wall-time difference only. " + METHOD
        summary = {
            "median_of_per_repeat_ratios": median(x["ratio"] for x in per),
            "wall_plain_samples_per_s": median(x["plain_wall_samples_per_s"] for x in per),
            "wall_flextrain_samples_per_s": median(x["flextrain_wall_samples_per_s"] for x in per),
            "wall_ratio": median(x["wall_ratio"] for x in per),
            # Fixed cost of a flextrain job outside its per-step work (start-up, rendezvous, shutdown).
            "flextrain_fixed_seconds": median(
                x["seconds"] - x["samples"] / flex for x in runs["flextrain"]) if flex else None,
            "runs_with_interference": busy_runs,  # kept although others used the CPU (retries exhausted)
        }
        # Same model, data, order, seed and step count: the final weights should agree.
        ft = final_weights(root / f"job-e{args.epochs_long}")
        summary["final_weights_max_abs_diff"] = max(
            float((ft[k] - v).abs().max()) for k, v in plain_model.state_dict().items())
        runs = {**summary, **runs}
        if busy_runs:
            log(f"WARNING: {busy_runs} kept runs shared the CPU with other processes; numbers are noisy")

        result = {
            "bench": "overhead",
            "plain_samples_per_s": round(plain, 1),
            "flextrain_samples_per_s": round(flex, 1),
            "ratio": round(flex / plain, 4),
            "target_ratio": TARGET_RATIO,
            "meets_target": flex / plain >= TARGET_RATIO,
            "steps": long_steps - short_steps,
            "steps_short": short_steps,
            "steps_long": long_steps,
            "global_batch_size": G,
            "threads": threads,
            "records": sum(sizes),
            "files": len(files),
            "model": "bench/models/mlp.py:Model (256-1024-1024-10 MLP, SGD momentum 0.9)",
            "repeats": args.repeats,
            "method": method,
            "runs": runs,
        }
        print(json.dumps(result))
        return 0
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
