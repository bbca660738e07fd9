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

Throughput is measured by difference (see METHOD below): every measurement
is taken at two step counts (``--epochs-short`` and ``--epochs-long``) and the
rate is ``(steps_long - steps_short) / (time_long - time_short)``. Fixed costs
-- process start-up, torch import, rendezvous, the final checkpoint, shutdown
for flextrain; the data pre-load for the plain loop -- cancel; everything that
happens per step (for flextrain also reading and decoding each step's records
and the task RPCs) stays in. Each measurement is repeated ``--repeats`` times,
plain and flextrain alternating, and the medians are reported.

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
    "difference method: every measurement is taken at two step counts (epochs_short, epochs_long) and "
    "samples/s = (samples_long - samples_short) / (seconds_long - seconds_short), so fixed costs cancel. "
    "flextrain: wall time of the whole `flextrain train --workers 1 --no-progress` subprocess "
    "(start-up, torch import, rendezvous, final checkpoint and shutdown cancel; per-step record reads, "
    "feed, task RPCs, heartbeats and the master's work stay in). plain: in-process wall time from reading "
    "all records with flextrain's RecordIO reader and one feed() over them (cancels) through the last "
    "optimizer step of a straightforward zero_grad/forward/loss/backward/step/loss.item() loop over "
    "in-memory tensors. Same module, data order (files in name order, sequential batches, no shuffle), "
    "global batch (no accumulation), seed, step count and torch threads; repeated with plain and "
    "flextrain alternating; medians reported, ratio = median flextrain / median plain."
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


def steps_for(file_sizes: list[int], batch: int, epochs: int) -> int:
    """Optimizer steps flextrain takes: tasks never cross files, a file's last batch may be short."""
    return epochs * sum(-(-n // batch) for n in file_sizes)


# ---- (a) the plain PyTorch loop --------------------------------------------------
def plain_run(mlp, files: list[str], *, batch: int, epochs: int, seed: int, lr: float | None):
    """A user's loop. Returns (seconds, steps, samples, model)."""
    from flextrain.data import open_reader

    t0 = time.perf_counter()
    features, labels, bounds = [], [], []
    for path in files:  # the same files, in the same order, as flextrain's shards
        records = list(open_reader(path).read())
        x, y = mlp.feed(records, "training", None)
        features.append(x)
        labels.append(y)
    torch.manual_seed(seed)
    model = mlp.Model()
    optimizer = mlp.optimizer(model.parameters()) if lr is None else mlp.optimizer(model.parameters(), lr=lr)
    model.train()
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
    seconds = time.perf_counter() - t0
    return seconds, steps, samples, model, loss_sum / max(samples, 1)


# ---- (b) flextrain ------------------------------------------------------------------
def flextrain_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "flextrain"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("flextrain")
    return [found] if found else [sys.executable, "-m", "flextrain"]


def flextrain_run(data_dir: Path, job_dir: Path, *, batch: int, epochs: int, seed: int, lr: float | None):
    """Returns (seconds, steps, status dict)."""
    if job_dir.exists():
        shutil.rmtree(job_dir)
    cmd = flextrain_cmd() + [
        "train", "--model-def", f"{MODEL_FILE}:Model", "--training-data", str(data_dir),
        "--workers", "1", "--epochs", str(epochs), "--global-batch-size", str(batch),
        "--seed", str(seed), "--no-progress", "--job-dir", str(job_dir),
    ]
    if lr is not None:
        cmd += ["--lr", str(lr)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    status_path = job_dir / "status.json"
    status = json.loads(status_path.read_text()) if status_path.exists() else {}
    if proc.returncode != 0 or status.get("phase") != "Succeeded":
        logs = "".join(p.read_text(errors="replace")[-2000:] for p in sorted((job_dir / "logs").glob("*")))
        raise SystemExit(
            f"flextrain run failed (exit {proc.returncode}, phase {status.get('phase')}): "
            f"{' '.join(cmd)}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}\n{logs}"
        )
    return seconds, int(status.get("step", -1)), status


def final_weights(job_dir: Path) -> dict:
    from flextrain.elastic.statecodec import decode

    return decode((job_dir / "checkpoints" / "final.ckpt").read_bytes())["model"]


# ---- main -------------------------------------------------------------------------------
def rate(short: dict, long: dict) -> float:
    return (long["samples"] - short["samples"]) / (long["seconds"] - short["seconds"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=32768, help="training records (1028 bytes each)")
    p.add_argument("--files", type=int, default=4, help="RecordIO files (shards) the records are spread over")
    p.add_argument("--global-batch-size", type=int, default=256)
    p.add_argument("--epochs-short", type=int, default=1)
    p.add_argument("--epochs-long", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the module's)")
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
        log(f"wrote {sum(sizes)} records in {len(files)} files to {data_dir} ({time.perf_counter() - t0:.1f}s); "
            f"G={G}, threads={threads}, epochs {args.epochs_short}/{args.epochs_long}, repeats {args.repeats}")

        runs = {"plain": [], "flextrain": [], "per_repeat": []}
        plain_model = None
        for r in range(args.repeats):
            order = (args.epochs_short, args.epochs_long) if r % 2 == 0 else (args.epochs_long, args.epochs_short)
            got = {"plain": {}, "flextrain": {}}
            for epochs in order:
                expected = steps_for(sizes, G, epochs)
                sec, steps, samples, model, loss = plain_run(mlp, files, batch=G, epochs=epochs, seed=args.seed,
                                                             lr=args.lr)
                assert steps == expected, (steps, expected)
                rec = {"repeat": r, "epochs": epochs, "steps": steps, "samples": samples,
                       "seconds": round(sec, 4), "mean_loss": round(loss, 5)}
                runs["plain"].append(rec)
                got["plain"][epochs] = rec
                log(f"repeat {r} plain     epochs={epochs} steps={steps} {sec:7.2f}s")
                if epochs == args.epochs_long:
                    plain_model = model

                job_dir = root / f"job-e{epochs}"
                sec, steps, status = flextrain_run(data_dir, job_dir, batch=G, epochs=epochs, seed=args.seed,
                                                   lr=args.lr)
                if steps != expected:
                    raise SystemExit(f"flextrain took {steps} steps, expected {expected}")
                rec = {"repeat": r, "epochs": epochs, "steps": steps, "samples": samples,
                       "seconds": round(sec, 4), "loss": status.get("metrics", {}).get("loss")}
                runs["flextrain"].append(rec)
                got["flextrain"][epochs] = rec
                log(f"repeat {r} flextrain epochs={epochs} steps={steps} {sec:7.2f}s")
            pr = rate(got["plain"][args.epochs_short], got["plain"][args.epochs_long])
            fr = rate(got["flextrain"][args.epochs_short], got["flextrain"][args.epochs_long])
            runs["per_repeat"].append({"repeat": r, "plain_samples_per_s": round(pr, 1),
                                       "flextrain_samples_per_s": round(fr, 1), "ratio": round(fr / pr, 4)})
            log(f"repeat {r}: plain {pr:.0f} samples/s, flextrain {fr:.0f} samples/s, ratio {fr / pr:.4f}")

        plain = statistics.median(x["plain_samples_per_s"] for x in runs["per_repeat"])
        flex = statistics.median(x["flextrain_samples_per_s"] for x in runs["per_repeat"])
        short_steps = steps_for(sizes, G, args.epochs_short)
        long_steps = steps_for(sizes, G, args.epochs_long)
        # Fixed cost of a flextrain job (start-up + shutdown), from the short runs and the median rate.
        fixed = [x["seconds"] - x["samples"] / flex for x in runs["flextrain"]]
        runs["flextrain_fixed_seconds_median"] = round(statistics.median(fixed), 3)
        runs["median_of_per_repeat_ratios"] = statistics.median(x["ratio"] for x in runs["per_repeat"])
        # Same model, data, order and step count: the final weights should agree.
        ft = final_weights(root / f"job-e{args.epochs_long}")
        diff = max(float((ft[k] - v).abs().max()) for k, v in plain_model.state_dict().items())
        runs["final_weights_max_abs_diff"] = diff

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
            "method": METHOD,
            "runs": runs,
        }
        print(json.dumps(result))
        return 0
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
