"""Convert a small CSV to RecordIO shards with ``flextrain data convert``, inspect them, decode them as a feed would.

    python examples/convert_and_inspect.py              # in a temporary directory
    python examples/convert_and_inspect.py --keep DIR   # leaves the CSV and the shards in DIR

Prints the commands' output, then one JSON line with what was read back (the test reads it).
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
from pathlib import Path

import numpy as np

from flextrain.cli import main as flextrain
from flextrain.data import RecordIOReader
from flextrain.data.rows import decode_rows, load_schema


def write_csv(path: Path, rows: int) -> np.ndarray:
    x = np.random.default_rng(0).normal(size=(rows, 3))
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["x0", "x1", "x2", "label", "city"])
        w.writerows([*map(float, r), int(r[0] > 0), ("Oslo", "Lima")[i % 2]] for i, r in enumerate(x))
    return x


def run(workdir: Path) -> dict:
    x = write_csv(workdir / "points.csv", 25)
    out = workdir / "points"
    assert flextrain(["data", "convert", str(workdir / "points.csv"), "--out", str(out), "--shard-size", "10",
                      "--quiet"]) == 0
    assert flextrain(["data", "inspect", str(out), "--head", "2"]) == 0
    schema = load_schema(out)  # what a model's feed does with the records of one task
    records = [r for name, _ in schema.shards for r in RecordIOReader(out / name)]
    columns = decode_rows(records, schema)
    features = np.stack([columns["x0"], columns["x1"], columns["x2"]], axis=1)
    return {"records": len(records), "shards": [name for name, _ in schema.shards],
            "exact": bool(np.array_equal(features, x)), "labels": int(columns["label"].sum()),
            "cities": sorted(set(columns["city"]))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keep", type=Path, help="work in this directory and leave the files there")
    args = p.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        result = run(args.keep)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = run(Path(tmp))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
