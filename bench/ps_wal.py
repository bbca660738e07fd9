"""The PS write-ahead log's own cost: a dense push into a shard with the log vs one without, in one process.

    .venv/bin/python bench/ps_wal.py                        # 32 MB pushes, 100 pairs, ~30 s
    .venv/bin/python bench/ps_wal.py --fsync                # the log flushed before answering (--ps-wal-fsync)
    .venv/bin/python bench/ps_wal.py --repo ../other-checkout   # measure another checkout's PS code
    .venv/bin/python bench/ps_wal.py --pushes 10 --mb 4     # smoke test

Prints exactly one JSON object on stdout (progress on stderr). Two shards live
in this process (ASYNC, SGD, one torch thread): one in memory, one durable as
in a job (a ``Checkpointer`` with checkpoints every 20 versions and the
write-ahead log). Each round pushes the same gradient into both, in turns
(the order alternates), timing ``ShardState.push`` (apply, log, wait for the
log) from a filled receive buffer: no gRPC, so this isolates what the log
adds. ``ratio = unlogged / logged`` per round, median with a 95% bootstrap
interval; the first rounds, before the log's segments are recycled (two
checkpoints), are reported apart from the steady rounds after them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def log(msg: str) -> None:
    print(f"[bench/ps_wal] {msg}", file=sys.stderr, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=32, help="dense gradient per push, MiB of float32")
    p.add_argument("--pushes", type=int, default=100, help="rounds (one push into each shard per round)")
    p.add_argument("--fsync", action="store_true", help="fdatasync the log before answering")
    p.add_argument("--repo", default=str(HERE.parent), help="checkout whose flextrain is measured")
    p.add_argument("--dir", default=None, help="directory for the log (default: a temporary one under /tmp)")
    args = p.parse_args()
    if args.pushes < 1 or args.mb <= 0:
        p.error("--pushes must be >= 1 and --mb > 0")
    sys.path.insert(0, str(Path(args.repo).resolve()))

    import torch

    from flextrain.ps.checkpoint import Checkpointer
    from flextrain.ps.dense import Spec
    from flextrain.ps.optimizers import make_optimizer
    from flextrain.ps.settings import SyncSettings
    from flextrain.ps.state import ShardState
    from interleave import median_ci

    torch.set_num_threads(1)
    n = int(args.mb * (1 << 20)) // 4
    grad = torch.randn(n, generator=torch.Generator().manual_seed(0)).numpy().tobytes()
    every = 20

    def shard(directory: str | None):
        s = ShardState(0, 1, optimizer=make_optimizer("sgd", {"lr": 1e-3}), sync=SyncSettings("async"))
        ck = None
        if directory is not None:
            ck = Checkpointer(directory, 0, every=every, wal_fsync=args.fsync)
            ck.restore(s)
            ck.attach(s)
        s.init_dense([Spec("w", "float32", (n,))], bytearray(4 * n))
        return s, ck

    def push(s, seq: int) -> float:
        buf = s.receive_buffer(4 * n)
        buf[:] = grad
        t = time.perf_counter()
        result = s.push(client_id="bench", seq=seq, base_version=0, layout_id=s.dense.layout_id, dense=buf)
        elapsed = time.perf_counter() - t
        assert result.applied
        return elapsed

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        plain, _ = shard(None)
        durable, ck = shard(tmp)
        times = {"plain": [], "logged": []}
        for r in range(args.pushes):
            order = (("plain", plain), ("logged", durable)) if r % 2 == 0 else (("logged", durable), ("plain", plain))
            for name, s in order:
                times[name].append(push(s, r + 1))
            if (r + 1) % 10 == 0:
                log(f"round {r + 1}/{args.pushes}: plain {times['plain'][-1] * 1e3:.1f} ms, "
                    f"logged {times['logged'][-1] * 1e3:.1f} ms")
        ck.flush(120)
        durable.wal.close()
        files = sorted(p.name for p in (Path(tmp) / "ps-0").iterdir())

    ratios = [a / b for a, b in zip(times["plain"], times["logged"])]
    warm = min(len(ratios), 2 * every + 1)  # the log recycles segments from the second checkpoint on

    def summary(values: list[float]) -> dict | None:
        if not values:
            return None
        low, high = median_ci(values)
        return {"median": round(statistics.median(values), 3), "ci95": [round(low, 3), round(high, 3)],
                "n": len(values)}

    print(json.dumps({
        "bench": "ps_wal",
        "config": {"mb": args.mb, "pushes": args.pushes, "fsync": args.fsync, "checkpoint_every": every,
                   "repo": str(Path(args.repo).resolve()), "cpus": os.cpu_count()},
        "ratio_steady": summary(ratios[warm:]),
        "ratio_first": summary(ratios[:warm]),
        "push_ms_median": {k: round(statistics.median(v) * 1e3, 1) for k, v in times.items()},
        "logged_ms_steady_median": round(statistics.median(times["logged"][warm:]) * 1e3, 1)
        if len(ratios) > warm else None,
        "files_at_end": files,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }))


if __name__ == "__main__":
    main()
