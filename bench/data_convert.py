"""``flextrain data convert`` throughput: CSV -> RecordIO at 1 and 2 workers, vs a plain baseline.

    .venv/bin/python bench/data_convert.py                        # 200k rows x 32 float columns, ~1 min on 2 cores
    .venv/bin/python bench/data_convert.py --rows 2000 --cols 4   # smoke test

A CSV of ``--rows`` rows of ``--cols`` random float64 columns (8 significant digits,
with a header) is generated once. Three sides convert it, each ``--repeats``
times, into a fresh directory, and the best (shortest) wall time counts:

* **baseline**: the plain way in one process: ``csv.reader`` over the file,
  ``float()`` of every value, ``struct.pack`` of each row (32 little-endian
  float64s, the record flextrain writes), ``write_records`` per shard of
  ``--shard-size`` rows (snappy, as convert does);
* **convert_w1**, **convert_w2**: ``flextrain.data.convert.convert`` (type
  inference, the row encoding, atomic shards, ``schema.json``) with 1 and
  2 workers.

Reported per side: records/s and MB/s (of CSV input read) and the ratio to the
baseline (``> 1``: faster). One JSON object on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flextrain.data import write_records  # noqa: E402
from flextrain.data.convert import ConvertOptions, convert  # noqa: E402


def make_csv(path: Path, rows: int, cols: int) -> None:
    x = np.random.default_rng(0).normal(size=(rows, cols))
    with open(path, "w", newline="") as f:
        f.write(",".join(f"c{i}" for i in range(cols)) + "\n")
        np.savetxt(f, x, delimiter=",", fmt="%.8g")


def baseline(src: Path, out: Path, shard_size: int) -> int:
    out.mkdir()
    with open(src, newline="") as f:
        reader = csv.reader(f)
        cols = len(next(reader))
        pack = struct.Struct(f"<{cols}d").pack
        shard, n, records = 0, 0, []
        for row in reader:
            records.append(pack(*map(float, row)))
            if len(records) == shard_size:
                write_records(out / f"data-{shard:05d}", records)
                shard, n, records = shard + 1, n + len(records), []
        if records:
            write_records(out / f"data-{shard:05d}", records)
            n += len(records)
    return n


def timed(fn) -> tuple[float, int]:
    start = time.perf_counter()
    n = fn()
    return time.perf_counter() - start, n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--cols", type=int, default=32)
    p.add_argument("--shard-size", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-convert-"))
    try:
        src = tmp / "data.csv"
        make_csv(src, args.rows, args.cols)
        mb = os.path.getsize(src) / 1e6
        print(f"generated {args.rows} x {args.cols} CSV, {mb:.1f} MB", file=sys.stderr)
        sides = {
            "baseline": lambda out: baseline(src, out, args.shard_size),
            "convert_w1": lambda out: convert(src, out, ConvertOptions(shard_size=args.shard_size, workers=1)).schema.records,
            "convert_w2": lambda out: convert(src, out, ConvertOptions(shard_size=args.shard_size, workers=2)).schema.records,
        }
        best: dict[str, float] = {}
        for r in range(args.repeats):
            for name, side in sides.items():  # interleaved, so drift hits every side alike
                out = tmp / f"{name}-{r}"
                seconds, n = timed(lambda: side(out))
                assert n == args.rows, (name, n)
                shutil.rmtree(out)
                best[name] = min(best.get(name, float("inf")), seconds)
                print(f"round {r}: {name} {seconds:.2f} s", file=sys.stderr)
        result = {"bench": "data_convert", "rows": args.rows, "cols": args.cols, "csv_mb": round(mb, 2),
                  "shard_size": args.shard_size, "repeats": args.repeats, "cores": os.cpu_count(), "sides": {}}
        for name, seconds in best.items():
            result["sides"][name] = {"seconds": round(seconds, 3), "records_per_s": round(args.rows / seconds),
                                     "mb_per_s": round(mb / seconds, 2),
                                     "vs_baseline": round(best["baseline"] / seconds, 3)}
        result["w2_vs_w1"] = round(best["convert_w1"] / best["convert_w2"], 3)
        print(json.dumps(result))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
