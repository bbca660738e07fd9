"""The record cache's gain: a worker's epochs over multi-chunk RecordIO files with the cache on vs off.

    .venv/bin/python bench/record_cache.py                   # 4 files x 16 MiB (4 MiB chunks), 12 epochs each side, ~1 min
    .venv/bin/python bench/record_cache.py --shuffle         # tasks in a new random order every epoch
    .venv/bin/python bench/record_cache.py --mb 4 --epochs 3 # smoke test

Prints exactly one JSON object on stdout (progress on stderr). One process reads as a worker does
(flextrain/worker/trainer.py): for each task a reader found through ``shard_reader`` (the process's
reader cache), then the task's steps as ``RecordBatch``-es, each given to ``bench/models/mlp.py``'s
``feed`` — no training, so the figure is the data path alone. The two sides are the same loop with
``configure_record_cache(budget)`` and ``configure_record_cache(0)`` (off: each reader keeps only the
chunk it read last, as before the cache); they take turns epoch by epoch (the order alternates), after
one unmeasured epoch each. ``ratio = off seconds / on seconds`` per pair of epochs: the speed-up of
the data path, median with a 95% bootstrap interval.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from interleave import median_ci  # noqa: E402
from overhead_sides import load_module  # noqa: E402


def write_files(root: Path, mlp, *, files: int, mb: int, chunk_mb: int) -> list[str]:
    from flextrain.data import write_records

    rng = np.random.default_rng(0)
    per_file = mb * (1 << 20) // mlp.RECORD_BYTES
    paths = []
    for i in range(files):
        x = rng.standard_normal((per_file, mlp.FEATURES), dtype=np.float32)
        y = rng.integers(0, mlp.CLASSES, per_file)
        path = root / f"part-{i}.rio"
        write_records(path, mlp.encode(x, y), max_chunk_size=chunk_mb << 20)  # snappy, flextrain's default
        paths.append(str(path))
    return paths


def tasks_of(paths: list[str], *, batch: int, steps_per_task: int) -> list[tuple[str, int, int]]:
    from flextrain.data import open_reader

    size = batch * steps_per_task
    return [(p, lo, min(lo + size, len(open_reader(p)))) for p in paths for lo in range(0, len(open_reader(p)), size)]


def epoch(mlp, tasks, *, batch: int) -> float:
    """Seconds to read and feed every step of ``tasks``, a reader found per task as the worker does."""
    from flextrain.data import shard_reader

    began = time.perf_counter()
    for path, lo, hi in tasks:
        read = shard_reader(path, as_batch=True)
        for start in range(lo, hi, batch):
            mlp.feed(read(start, min(start + batch, hi)), "training", None)
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--mb", type=int, default=16, help="MiB of records per file")
    p.add_argument("--chunk-mb", type=int, default=4, help="RecordIO chunk size (writers' default: 32)")
    p.add_argument("--epochs", type=int, default=12, help="measured epochs per side")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps-per-task", type=int, default=8)
    p.add_argument("--budget-mb", type=int, default=512)
    p.add_argument("--shuffle", action="store_true", help="tasks in a new random order every epoch")
    args = p.parse_args(argv)

    from flextrain.data import chunkcache

    mlp = load_module()
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_files(Path(tmp), mlp, files=args.files, mb=args.mb, chunk_mb=args.chunk_mb)
        tasks = tasks_of(paths, batch=args.batch, steps_per_task=args.steps_per_task)
        rng = random.Random(0)
        # Each side has a cache of its own, swapped in for its epochs, so the "off" side (budget 0) never
        # empties the "on" side's.
        caches = {"on": chunkcache.ChunkCache(args.budget_mb << 20), "off": chunkcache.ChunkCache(0)}
        seconds: dict[str, list[float]] = {"on": [], "off": []}
        for i in range(args.epochs + 1):
            order = list(tasks)
            if args.shuffle:
                rng.shuffle(order)
            for side in (["on", "off"] if i % 2 else ["off", "on"]):
                chunkcache._cache = caches[side]
                took = epoch(mlp, order, batch=args.batch)
                if i:  # the first epoch of each side fills the cache: not measured
                    seconds[side].append(took)
            print(f"epoch {i}: on {seconds['on'][-1:] or '-'} off {seconds['off'][-1:] or '-'}", file=sys.stderr)
        ratios = [off / on for on, off in zip(seconds["on"], seconds["off"])]
        stats = caches["on"].stats()
    med, (lo, hi) = float(np.median(ratios)), median_ci(ratios)
    print(json.dumps({
        "bench": "record_cache",
        "method": "one process reads and feeds every step of every task as a worker does (a reader per task "
                  "via shard_reader), with the record cache on vs off (a budget of 0), the sides "
                  "taking turns epoch by epoch after one unmeasured epoch each; ratio = off / on seconds per pair",
        "files": args.files, "mb_per_file": args.mb, "chunk_mb": args.chunk_mb, "shuffle": args.shuffle,
        "tasks": len(tasks), "epochs_per_side": args.epochs,
        "ratio": round(med, 3), "ratio_ci95": [round(lo, 3), round(hi, 3)],
        "epoch_seconds_on_median": round(float(np.median(seconds["on"])), 4),
        "epoch_seconds_off_median": round(float(np.median(seconds["off"])), 4),
        "cache_mib_at_end": round(stats.bytes / (1 << 20), 1), "cache_chunks_at_end": stats.entries,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
