"""TLS's cost on the parameter servers' data path: the same PS code over TLS with the job's token vs plaintext.

    .venv/bin/python bench/tls.py                       # 32 MiB model, 100k rows, 11 repeats, ~40 s on 2 cores
    .venv/bin/python bench/tls.py --mb 4 --emb-ids 10000 --repeats 2   # smoke test

Prints exactly one JSON object on stdout (progress on stderr). Two single-shard parameter servers run as
subprocesses on loopback (ASYNC mode, SGD, one torch thread each): one plaintext, one with a job's TLS
material and token (``flextrain.protocol.security``, as ``flextrain train --tls`` gives every PS). In the
same run the sides take turns, the first side alternating each repeat, on

* dense: ``PSClient.push`` of the model's gradients, then ``pull_dense`` of the parameters into the
  model's tensors;
* embedding: ``pull_embedding`` of N ids, then ``push`` of their sparse gradients.

Each repeat gives a paired ratio ``plaintext seconds / TLS seconds`` (throughput over TLS as a fraction of
plaintext); the JSON has their median with a bootstrap 95% interval. AllReduce training is not measured:
its gradients move over gloo, not gRPC; TLS covers its control RPCs only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))


def log(msg: str) -> None:
    print(f"[bench/tls] {msg}", file=sys.stderr, flush=True)


def start_ps(tmp: Path, name: str, tls_dir: Path | None) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    if tls_dir is not None:
        env["FLEXTRAIN_TLS_DIR"] = str(tls_dir)
    address = tmp / f"{name}.addr"
    proc = subprocess.Popen([sys.executable, "-m", "flextrain.ps.main", "--shard-index", "0", "--num-ps", "1",
                             "--host", "127.0.0.1", "--address-file", str(address), "--mode", "async",
                             "--optimizer", "sgd", "--hyper", "lr=0.001", "--torch-threads", "1"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not address.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"PS {name} did not start (exit {proc.poll()})")
        time.sleep(0.05)
    return proc, address.read_text().strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=32, help="dense model size in MiB (float32)")
    p.add_argument("--emb-ids", type=int, default=100_000)
    p.add_argument("--emb-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=11)
    args = p.parse_args()

    import numpy as np
    import torch

    from flextrain.protocol.security import make_credentials, write_credentials
    from flextrain.worker.ps_client import PSClient
    from interleave import median_ci

    torch.manual_seed(0)
    torch.set_num_threads(1)
    big = int(args.mb * (1 << 20) / 4) // 8
    params = {f"layer{i}.weight": torch.randn(big) for i in range(8)}
    grads = {name: torch.full_like(t, 1e-3) for name, t in params.items()}
    creds = make_credentials("bench-tls")
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        write_credentials(tmp / "tls", creds)
        procs = []
        try:
            plain_proc, plain_addr = start_ps(tmp, "plain", None)
            procs.append(plain_proc)
            tls_proc, tls_addr = start_ps(tmp, "tls", tmp / "tls")
            procs.append(tls_proc)
            sides = {"plain": PSClient([plain_addr], give_up=30), "tls": PSClient([tls_addr], give_up=30, creds=creds)}
            models = {side: {k: v.clone() for k, v in params.items()} for side in sides}
            versions = {}
            ids = np.random.default_rng(0).choice(1 << 40, size=args.emb_ids, replace=False).astype(np.int64)
            emb_grad = torch.full((len(ids), args.emb_dim), 1e-3)
            for side, client in sides.items():
                client.init_dense(models[side])
                versions[side], _ = client.pull_dense(None)
                client.declare_table("emb", args.emb_dim, seed=1)
                client.pull_embedding("emb", ids)  # rows created: steady-state lookups

            def dense(side: str) -> float:
                client, began = sides[side], time.perf_counter()
                client.push(grads, version=versions[side])
                versions[side], _ = client.pull_dense(versions[side], out=models[side])
                return time.perf_counter() - began

            def embedding(side: str) -> float:
                client, began = sides[side], time.perf_counter()
                client.pull_embedding("emb", ids)
                client.push(sparse_grads={"emb": (ids, emb_grad)})
                return time.perf_counter() - began

            for side in sides:  # warm-up: connections (the TLS handshake), allocator, caches
                dense(side), embedding(side)
            runs = {kind: {"plain": [], "tls": []} for kind in ("dense", "embedding")}
            for r in range(args.repeats):
                order = ("plain", "tls") if r % 2 == 0 else ("tls", "plain")
                for kind, fn in (("dense", dense), ("embedding", embedding)):
                    for side in order:
                        runs[kind][side].append(fn(side))
                log(f"repeat {r + 1}/{args.repeats}: " + ", ".join(
                    f"{kind} plain {v['plain'][-1]:.3f}s tls {v['tls'][-1]:.3f}s" for kind, v in runs.items()))
            for client in sides.values():
                client.close()
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=30)

    def summary(kind: str, moved_mb: float) -> dict:
        ratios = [pl / tl for pl, tl in zip(runs[kind]["plain"], runs[kind]["tls"])]
        median, (low, high) = statistics.median(ratios), median_ci(ratios)
        plain, tls = sorted(runs[kind]["plain"]), sorted(runs[kind]["tls"])
        return {"tls_vs_plain": round(median, 3), "ci95": [round(low, 3), round(high, 3)],
                "plain_MBps": round(moved_mb / plain[len(plain) // 2], 1), "tls_MBps": round(moved_mb / tls[len(tls) // 2], 1)}

    dense_mb = 2 * sum(t.numel() * 4 for t in params.values()) / 1e6
    emb_mb = len(ids) * (8 * 2 + args.emb_dim * 4 * 2) / 1e6
    print(json.dumps({"bench": "tls", "config": {"dense_mib": args.mb, "emb_ids": args.emb_ids, "emb_dim": args.emb_dim,
                                                  "repeats": args.repeats, "cpus": os.cpu_count()},
                      "dense": summary("dense", dense_mb), "embedding": summary("embedding", emb_mb),
                      "load_avg": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
