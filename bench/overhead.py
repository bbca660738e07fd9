"""flextrain overhead benchmark: a 1-worker flextrain job vs. plain PyTorch loops.

Runs the same model (``bench/models/mlp.py``: 256 -> 1024 -> 1024 -> 10 MLP,
SGD with momentum) on the same synthetic RecordIO data, with the same global
batch, data order, seed, number of optimizer steps and number of torch
threads as three sides:

  stream     a plain PyTorch loop in this process that reads each step's
             records from the RecordIO files with flextrain's reader and
             turns them into tensors with the module's ``feed`` as it goes
             (what a user training on these files writes), then
             ``zero_grad / forward / loss / backward / step / loss.item()``;
  memory     the same loop over tensors read and ``feed``-ed once before the
             clock starts (a data set held in memory: no reading at all);
  flextrain  ``flextrain train --workers 1 --no-progress ...`` as a subprocess.

``ratio`` = flextrain / memory: flextrain is charged for reading its data
at all. ``ratio_vs_stream`` = flextrain / stream is like for like: both read
and ``feed`` the same records during training, so it is what flextrain's
orchestration costs (tasks, RPCs, heartbeats, the master, its threads).

Both sides time the same thing: the bench module's optimizer carries a
post-step hook that records ``time.perf_counter()`` after every optimizer
step (``FLEXTRAIN_BENCH_STEP_TIMES``; the flextrain worker writes its list to
a file when it exits). Throughput is the samples of steps 2..N divided by the
time from the end of step 1 to the end of step N: process start-up, torch
import, module loading, rendezvous, the first (warm-up) step and the final
checkpoint are outside; everything flextrain does per step (reading and
decoding the step's records, ``feed``, task RPCs, heartbeats, the master's
work) is inside. Each side runs ``--repeats`` times, taking turns to go first;
medians are reported, and paired per-repeat and best-run ratios next to them.
The final weights of the last runs are compared as a check that all sides
did the same work (``runs.final_weights_max_abs_diff``).

On a 2-core machine any other busy process slows 2-thread training several-
fold, so the CPU other processes use during each run is measured; disturbed
runs are discarded and repeated (``--max-other-cpu``, ``--retries``, within
``--max-seconds``); ``runs.kept_disturbed_runs`` > 0 means: do not trust the result.

Usage (from the repository root):

    .venv/bin/python bench/overhead.py            # ~8 min on an idle 2-core box (12 repeats)
    .venv/bin/python bench/overhead.py --repeats 1 --records 4096   # smoke test

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
    "per-step clock: the bench module's optimizer has a post-step hook recording time.perf_counter() "
    "after every optimizer step, identical on every side (flextrain's worker dumps the list at exit, "
    "env FLEXTRAIN_BENCH_STEP_TIMES). samples/s = samples of steps 2..N / (t_N - t_1): start-up, torch "
    "import, module load, rendezvous, the first step's warm-up and the final checkpoint are excluded; "
    "everything per step is included -- for flextrain reading + decoding each step's records and feed, "
    "task RPCs, heartbeats and the master's work on the shared cores. stream: in-process loop that reads "
    "each step's records with flextrain's read_shard_range (reader cache cleared first, so every chunk is "
    "decoded once, as in a new worker) and feeds them, then zero_grad, forward, loss, backward, step, "
    "loss.item(). memory: the same loop over tensors fed once before the clock starts. Same module, data "
    "order (files in name order, sequential batches, no shuffle), global batch (no accumulation), seed, "
    "step count and torch threads (flextrain gives a lone worker cpu_count threads). Repeated with the "
    "sides taking turns to go first; ratio = median flextrain / median memory, ratio_vs_stream = median "
    "flextrain / median stream. A run during which other processes used more than max_other_cpu cores "
    "is discarded and repeated."
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


def step_sizes(file_sizes: list[int], batch: int, epochs: int) -> list[int]:
    """Samples of every optimizer step flextrain takes: tasks never cross files, a file's last
    batch may be short."""
    one = [min(batch, n - i) for n in file_sizes for i in range(0, n, batch)]
    return one * epochs


# ---- (a) the plain PyTorch loops ------------------------------------------------
def plain_run(mlp, files: list[str], *, batch: int, epochs: int, seed: int, lr: float | None,
              stream: bool) -> dict:
    """A user's loop: over tensors pre-loaded once (``stream=False``), or reading and ``feed``-ing
    each step's records from the files as it goes (``stream=True``), with flextrain's reader."""
    from flextrain.data import clear_reader_cache, open_reader, read_shard_range

    clear_reader_cache()  # decode every chunk afresh, like flextrain's new worker process
    sizes = [len(open_reader(path)) for path in files]
    loaded = None if stream else [mlp.feed(list(open_reader(path).read()), "training", None) for path in files]
    torch.manual_seed(seed)
    model = mlp.Model()
    optimizer = mlp.optimizer(model.parameters()) if lr is None else mlp.optimizer(model.parameters(), lr=lr)
    mlp.STEP_TIMES.clear()
    mlp.track_steps(optimizer)
    model.train()
    samples = 0
    loss_sum = 0.0
    for _ in range(epochs):
        for f, (path, n) in enumerate(zip(files, sizes)):  # the same files, in the same order, as flextrain's shards
            for i in range(0, n, batch):
                if stream:
                    xb, yb = mlp.feed(read_shard_range(path, i, min(i + batch, n)), "training", None)
                else:
                    xb, yb = loaded[f][0][i : i + batch], loaded[f][1][i : i + batch]
                optimizer.zero_grad()
                loss = mlp.loss(yb, model(xb))
                loss.backward()
                loss_sum += loss.item() * len(yb)
                optimizer.step()
                samples += len(yb)
    return {"step_times": list(mlp.STEP_TIMES), "model": model,
            "extra": {"mean_loss": round(loss_sum / max(samples, 1), 5)}}


# ---- (b) flextrain ------------------------------------------------------------------
def flextrain_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "flextrain"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("flextrain")
    return [found] if found else [sys.executable, "-m", "flextrain"]


def flextrain_run(mlp, data_dir: Path, job_dir: Path, *, batch: int, epochs: int, seed: int,
                  lr: float | None) -> dict:
    if job_dir.exists():
        shutil.rmtree(job_dir)
    job_dir.mkdir(parents=True)
    times_file = job_dir / "step-times.json"
    cmd = flextrain_cmd() + [
        "train", "--model-def", f"{MODEL_FILE}:Model", "--training-data", str(data_dir),
        "--workers", "1", "--epochs", str(epochs), "--global-batch-size", str(batch),
        "--seed", str(seed), "--no-progress", "--job-dir", str(job_dir),
    ]
    if lr is not None:
        cmd += ["--lr", str(lr)]
    env = {**os.environ, mlp.STEP_TIMES_ENV: str(times_file)}  # the worker inherits it
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    status_path = job_dir / "status.json"
    status = json.loads(status_path.read_text()) if status_path.exists() else {}
    if proc.returncode != 0 or status.get("phase") != "Succeeded" or not times_file.exists():
        logs = "".join(p.read_text(errors="replace")[-2000:] for p in sorted((job_dir / "logs").glob("*")))
        raise SystemExit(
            f"flextrain run failed (exit {proc.returncode}, phase {status.get('phase')}, step times "
            f"{'written' if times_file.exists() else 'missing'}): {' '.join(cmd)}\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}\n{logs}"
        )
    return {"step_times": json.loads(times_file.read_text()), "status": status,
            "extra": {"job_seconds": round(seconds, 3), "job_steps": status.get("step"),
                      "last_loss": status.get("metrics", {}).get("loss")}}


def final_weights(job_dir: Path) -> dict:
    from flextrain.elastic.statecodec import decode

    return decode((job_dir / "checkpoints" / "final.ckpt").read_bytes())["model"]


# ---- interference ---------------------------------------------------------------------------
class CPUMeter:
    """Average CPU cores the rest of the machine (other processes, hypervisor steal) used
    meanwhile: busy time from /proc/stat minus this process's and its waited-for children's."""

    def __init__(self) -> None:
        self.tick = os.sysconf("SC_CLK_TCK")
        self.other_cores: float | None = None

    def _sample(self):
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except OSError:
            return None
        fields = fields[:8]  # user nice system idle iowait irq softirq steal (guest is inside user)
        idle = fields[3] + fields[4]
        t = os.times()
        return (sum(fields) - idle) / self.tick, t.user + t.system + t.children_user + t.children_system

    def __enter__(self):
        self.start = self._sample()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        end = self._sample()
        wall = time.perf_counter() - self.t0
        if self.start is not None and end is not None and wall > 0:
            other = (end[0] - self.start[0]) - (end[1] - self.start[1])
            self.other_cores = max(0.0, other / wall)


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
def summarize(step_times: list[float], sizes: list[int]) -> dict:
    """Throughput over steps 2..N from post-step timestamps, plus per-step interval stats."""
    if len(step_times) != len(sizes):
        raise SystemExit(f"recorded {len(step_times)} optimizer steps, expected {len(sizes)}")
    t = np.asarray(step_times)
    dt = np.diff(t)
    window = float(t[-1] - t[0])
    samples = int(sum(sizes[1:]))
    return {
        "samples_per_s": samples / window,
        "window_seconds": round(window, 4),
        "window_samples": samples,
        "step_ms_mean": round(1e3 * float(dt.mean()), 3),
        "step_ms_median": round(1e3 * float(np.median(dt)), 3),
        "step_ms_p90": round(1e3 * float(np.percentile(dt, 90)), 3),
        "step_ms_max": round(1e3 * float(dt.max()), 3),
    }


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=32768, help="training records (1028 bytes each)")
    p.add_argument("--files", type=int, default=4, help="RecordIO files (shards) the records are spread over")
    p.add_argument("--global-batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the module's)")
    p.add_argument("--max-other-cpu", type=float, default=0.1,
                   help="a run during which other processes used more CPU cores than this (on average) is repeated")
    p.add_argument("--retries", type=int, default=2, help="repeats of a run disturbed by other processes")
    p.add_argument("--quiet-wait", type=float, default=20.0,
                   help="seconds to wait at most, before each run, for other processes to leave the CPU idle")
    p.add_argument("--max-seconds", type=float, default=900.0,
                   help="after this long, stop waiting for a quiet CPU and stop repeating disturbed runs")
    p.add_argument("--workdir", help="keep data and job dirs here instead of a temp dir")
    args = p.parse_args(argv)

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
        from flextrain.data import make_shards

        data_dir = root / "train"
        t0 = time.perf_counter()
        files = write_data(data_dir, mlp, records=args.records, files=args.files, seed=args.seed)
        sizes = step_sizes([s.size for s in make_shards(data_dir)], G, args.epochs)
        log(f"wrote {args.records} records in {len(files)} files to {data_dir} ({time.perf_counter() - t0:.1f}s); "
            f"G={G}, threads={threads}, {len(sizes)} steps per run, {args.repeats} repeats")
        for stream in (False, True):  # warm-up, discarded
            plain_run(mlp, files, batch=G, epochs=1, seed=args.seed, lr=args.lr, stream=stream)
        started = time.perf_counter()

        def plain(stream: bool):
            return lambda: plain_run(mlp, files, batch=G, epochs=args.epochs, seed=args.seed, lr=args.lr,
                                     stream=stream)

        def run_flextrain():
            return flextrain_run(mlp, data_dir, root / "job", batch=G, epochs=args.epochs, seed=args.seed,
                                 lr=args.lr)

        sides = (("stream", plain(True)), ("flextrain", run_flextrain), ("memory", plain(False)))
        runs = {name: [] for name, _ in sides} | {"discarded": []}
        kept_busy = 0
        last = {}
        for r in range(args.repeats):
            for name, fn in sides[r % 3:] + sides[: r % 3]:  # rotate who goes first
                for attempt in range(args.retries + 1):
                    over_budget = time.perf_counter() - started > args.max_seconds
                    waited = 0.0 if over_budget else wait_until_quiet(args.max_other_cpu, args.quiet_wait)
                    with CPUMeter() as meter:
                        res = fn()
                    rec = {"repeat": r, **summarize(res["step_times"], sizes), **res["extra"],
                           "other_cpu_cores": None if meter.other_cores is None else round(meter.other_cores, 3),
                           "attempt": attempt, "waited_for_quiet_s": round(waited, 1)}
                    busy = meter.other_cores is not None and meter.other_cores > args.max_other_cpu
                    log(f"repeat {r} {name:<9} {rec['samples_per_s']:8.0f} samples/s  step ms: mean "
                        f"{rec['step_ms_mean']:.2f} median {rec['step_ms_median']:.2f} p90 {rec['step_ms_p90']:.2f} "
                        f"max {rec['step_ms_max']:.1f}"
                        + (f"  [other processes used {meter.other_cores:.2f} cores]" if busy else ""))
                    if not busy:
                        break
                    if attempt < args.retries and not over_budget:
                        runs["discarded"].append({"side": name, **rec})
                        log("  ... disturbed: discarding and repeating this run")
                    else:
                        kept_busy += 1
                        rec["disturbed"] = True
                rec["samples_per_s"] = round(rec["samples_per_s"], 1)
                runs[name].append(rec)
                last[name] = res

        speed = {name: median(x["samples_per_s"] for x in runs[name]) for name, _ in sides}
        best = {name: max(x["samples_per_s"] for x in runs[name]) for name, _ in sides}

        def paired(base: str) -> list[float]:
            return [f["samples_per_s"] / b["samples_per_s"] for b, f in zip(runs[base], runs["flextrain"])]

        ft = final_weights(root / "job")
        summary = {
            "per_repeat_ratios_vs_stream": [round(x, 4) for x in paired("stream")],
            "per_repeat_ratios_vs_memory": [round(x, 4) for x in paired("memory")],
            "median_of_per_repeat_ratios_vs_stream": round(median(paired("stream")), 4),
            "median_of_per_repeat_ratios_vs_memory": round(median(paired("memory")), 4),
            "best_run_ratio_vs_stream": round(best["flextrain"] / best["stream"], 4),
            "best_run_ratio_vs_memory": round(best["flextrain"] / best["memory"], 4),
            "best_samples_per_s": best,
            "median_step_ms": {name: median(x["step_ms_median"] for x in runs[name]) for name, _ in sides},
            "kept_disturbed_runs": kept_busy,
            # Same model, data, order, seed and step count: the final weights should agree.
            "final_weights_max_abs_diff": max(
                float((ft[k] - v).abs().max()) for name in ("stream", "memory")
                for k, v in last[name]["model"].state_dict().items()),
        }
        if kept_busy:
            log(f"WARNING: {kept_busy} kept runs shared the CPU with other processes; numbers are noisy")
        ratio = speed["flextrain"] / speed["memory"]
        result = {
            "bench": "overhead",
            "memory_samples_per_s": round(speed["memory"], 1),
            "stream_samples_per_s": round(speed["stream"], 1),
            "flextrain_samples_per_s": round(speed["flextrain"], 1),
            "ratio": round(ratio, 4),
            "ratio_vs_stream": round(speed["flextrain"] / speed["stream"], 4),
            "target_ratio": TARGET_RATIO,
            "meets_target": ratio >= TARGET_RATIO,
            "steps": len(sizes),
            "timed_steps": len(sizes) - 1,
            "global_batch_size": G,
            "threads": threads,
            "records": args.records,
            "files": len(files),
            "epochs": args.epochs,
            "model": "bench/models/mlp.py:Model (256-1024-1024-10 MLP, SGD momentum 0.9)",
            "repeats": args.repeats,
            "method": METHOD,
            "runs": {**summary, **runs},
        }
        print(json.dumps(result))
        return 0
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
