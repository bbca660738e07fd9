"""Parameter-server throughput vs. raw gRPC streaming of the same bytes.

    .venv/bin/python bench/ps.py                 # 64 MiB model, 9 repeats, ~40 s on 2 cores
    .venv/bin/python bench/ps.py --mb 16 --repeats 1   # smoke test

Prints exactly one JSON object on stdout (progress on stderr). Two PS run as
subprocesses on loopback (ASYNC mode, SGD, one torch thread each), and so do
two "echo" servers: a trivial gRPC service defined here that moves raw bytes
(identity serialisers, no protobuf, no copies beyond gRPC's own) with the same
chunk size. In the same run, alternating, the bench measures

* dense: ``PSClient.push`` of the model's gradients then ``pull_dense`` of
  the updated parameters into the model's tensors (``out=``; both shards in
  parallel), vs. the echo servers receiving the same per-server byte counts
  and streaming them back into a reused buffer;
* embedding: ``pull_embedding`` of N distinct ids (rows created beforehand)
  into a reused tensor (``out=``) and ``push`` of their sparse gradients, vs. the echo servers moving the
  same bytes (ids + rows each way). ``--emb-order grouped`` (default) passes
  the ids the way the PS trainers do (``PSClient.distinct``: distinct, grouped
  by PS, ascending within a group, so each PS's rows are one range to pull
  into and push from), ``sorted`` ascending (each PS's rows are scattered
  into / gathered from every other place), ``random`` in random order (the
  client also sorts per call to find duplicates).

``--durable`` gives the PS a checkpoint directory, as the master does in a job:
then every push is also appended to the PS's write-ahead log (and a checkpoint
is written every 20 versions), which this measures too; ``--wal-fsync`` also
has the PS flush the log to the device before answering (one fdatasync per
group of pushes), as ``flextrain train --ps-wal-fsync`` does.

``ratio = PS / raw`` from the median of the repeats; target >= 0.70. ``cpu_ms`` is the CPU time
per operation (mean over the repeats), of the servers (the two PS, or the two echo servers) and of
the client (this process), read from /proc: unlike the wall-clock ratios it hardly moves with the
load other processes put on the machine, so it tells a change in the PS's own work from noise
(the servers' figure counts 10 ms clock ticks: at the smoke size it says little).
Work a PS does in the background (the log's helper thread, checkpoint writes) is counted in
whichever PS operation it overlaps.
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
from concurrent import futures
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def log(msg: str) -> None:
    print(f"[bench/ps] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the raw echo service

def _ident(x: bytes) -> bytes:
    return x


def serve_echo(address_file: str) -> None:
    """Push: a stream of byte chunks in, their count out. Pull: (total, chunk) in, that many bytes out."""
    def push(chunks, context):
        n = 0
        for c in chunks:
            n += len(c)
        return n.to_bytes(8, "little")

    def pull(request, context):
        total, chunk = int.from_bytes(request[:8], "little"), int.from_bytes(request[8:16], "little")
        blob = os.urandom(chunk)
        for o in range(0, total, chunk):
            yield blob if o + chunk <= total else blob[: total - o]

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", {
        "Push": grpc.stream_unary_rpc_method_handler(push, _ident, _ident),
        "Pull": grpc.unary_stream_rpc_method_handler(pull, _ident, _ident)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    tmp = address_file + ".tmp"
    Path(tmp).write_text(f"127.0.0.1:{port}")
    os.replace(tmp, address_file)
    server.wait_for_termination()


class Echo:
    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.push = self.channel.stream_unary("/bench.Echo/Push", _ident, _ident)
        self.pull = self.channel.unary_stream("/bench.Echo/Pull", _ident, _ident)

    def roundtrip(self, data: memoryview, out: memoryview, up: int, down: int, chunk: int) -> None:
        """Send ``up`` bytes of ``data`` in chunks, then receive ``down`` bytes into ``out``."""
        self.push((bytes(data[o: o + chunk]) for o in range(0, up, chunk)), timeout=120)
        pos = 0
        for piece in self.pull(down.to_bytes(8, "little") + chunk.to_bytes(8, "little"), timeout=120):
            out[pos: pos + len(piece)] = piece
            pos += len(piece)


# ---------------------------------------------------------------- processes

def _wait_file(path: Path, proc: subprocess.Popen, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text().strip()
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.args} exited with {proc.returncode}")
        time.sleep(0.05)
    raise RuntimeError(f"no address in {path} after {timeout}s")


def launch(tmp: Path, args) -> tuple[list[subprocess.Popen], list[str], list[str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs, ps_addrs, echo_addrs = [], [], []
    for i in range(2):
        f = tmp / f"ps{i}.addr"
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "flextrain.ps.main", "--shard-index", str(i), "--num-ps", "2",
             "--host", "127.0.0.1", "--address-file", str(f), "--mode", "async", "--optimizer", "sgd",
             "--hyper", "lr=0.001", "--torch-threads", "1", "--chunk-bytes", str(args.chunk_bytes),
             *(["--checkpoint-dir", str(tmp / "ckpt"), "--checkpoint-every", "20"] if args.durable else []),
             *(["--wal-fsync"] if args.wal_fsync else [])],
            env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # -m: cwd before PYTHONPATH
        ps_addrs.append(_wait_file(f, procs[-1]))
    for i in range(2):
        f = tmp / f"echo{i}.addr"
        procs.append(subprocess.Popen([sys.executable, __file__, "--serve-echo", str(f)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        echo_addrs.append(_wait_file(f, procs[-1]))
    return procs, ps_addrs, echo_addrs


# ---------------------------------------------------------------- measurements

def proc_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system, all threads) the processes ``pids`` have used so far (Linux /proc)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def thread_cpu(pids: list[int]) -> dict[str, float]:
    """CPU seconds per thread name (``comm``: the PS name their log's threads, gRPC its own) over ``pids``."""
    out: dict[str, float] = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                comm = (task / "comm").read_text().strip()
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # the thread ended meanwhile
                continue
            out[comm] = out.get(comm, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=64, help="dense model size in MiB (float32)")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--chunk-bytes", type=int, default=1 << 20)
    p.add_argument("--emb-ids", type=int, default=200_000, help="distinct ids per embedding pull/push")
    p.add_argument("--emb-dim", type=int, default=64)
    p.add_argument("--emb-order", choices=("grouped", "sorted", "random"), default="grouped",
                   help="order of the ids given to pull_embedding/push (grouped: as the PS trainers give them)")
    p.add_argument("--durable", action="store_true",
                   help="PS with a checkpoint directory, as in a job: checkpoints every 20 versions and the "
                        "write-ahead log of every push (default: in-memory PS)")
    p.add_argument("--wal-fsync", action="store_true",
                   help="with --durable: the PS fdatasync their log before answering (flextrain train --ps-wal-fsync)")
    p.add_argument("--serve-echo", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_echo:
        serve_echo(args.serve_echo)
        return
    if args.wal_fsync and not args.durable:
        p.error("--wal-fsync needs --durable (a PS without a checkpoint directory has no log)")

    import numpy as np
    import torch

    from flextrain.protocol.shard import dense_owner, row_owners
    from flextrain.worker.ps_client import PSClient

    torch.manual_seed(0)
    torch.set_num_threads(1)
    chunk = args.chunk_bytes
    # A model of 16 large matrices plus 48 small tensors, args.mb MiB of float32 in all.
    big = int(args.mb * (1 << 20) / 4 * 0.98) // 16
    params = {f"layer{i}.weight": torch.randn(big) for i in range(16)}
    params.update({f"layer{i}.bias": torch.randn(4096) for i in range(48)})
    per_ps = [0, 0]
    for name, t in params.items():
        per_ps[dense_owner(name, 2)] += t.numel() * 4
    total = sum(per_ps)
    grads = {name: torch.full_like(t, 1e-3) for name, t in params.items()}

    with tempfile.TemporaryDirectory() as tmpdir:
        procs, ps_addrs, echo_addrs = launch(Path(tmpdir), args)
        try:
            client = PSClient(ps_addrs, chunk_bytes=chunk, give_up=30)
            client.init_dense(params)
            version, _ = client.pull_dense(None)
            client.declare_table("emb", args.emb_dim, seed=1)
            rng = np.random.default_rng(0)
            ids = rng.choice(1 << 40, size=args.emb_ids, replace=False).astype(np.int64)
            if args.emb_order == "grouped":
                ids = client.distinct("emb", ids)[0]
            elif args.emb_order == "sorted":
                ids.sort()
            client.pull_embedding("emb", ids)  # create the rows: measure steady-state lookups
            emb_grad = torch.full((len(ids), args.emb_dim), 1e-3)
            owners = row_owners(ids, 2)
            emb_ps = [int((owners == i).sum()) for i in range(2)]
            row_bytes = args.emb_dim * 4
            echoes = [Echo(a) for a in echo_addrs]
            pool = futures.ThreadPoolExecutor(4)
            size = max(per_ps + [max(emb_ps) * (row_bytes + 8)])
            src = memoryview(bytearray(os.urandom(1 << 20)) * (size // (1 << 20) + 1))
            sinks = [memoryview(bytearray(len(src))) for _ in range(2)]  # reused, like the model's tensors

            ps_pids, echo_pids = [p.pid for p in procs[:2]], [p.pid for p in procs[2:]]
            cpu = {k: [0.0, 0.0] for k in ("raw_dense", "ps_dense", "raw_emb_pull", "raw_emb_push", "ps_emb_pull",
                                           "ps_emb_push")}  # kind -> [server, client] CPU seconds, summed

            threads = {k: {} for k in cpu if k.startswith("ps")}  # PS kind -> thread name -> CPU seconds

            def charged(kind, fn):
                pids = ps_pids if kind.startswith("ps") else echo_pids
                s0, c0, t0 = proc_cpu(pids), time.process_time(), thread_cpu(pids)
                out = fn()
                cpu[kind][0] += proc_cpu(pids) - s0
                cpu[kind][1] += time.process_time() - c0
                if kind in threads:
                    for name, sec in thread_cpu(pids).items():
                        threads[kind][name] = threads[kind].get(name, 0.0) + sec - t0.get(name, 0.0)
                return out

            def raw(ups, downs):
                t = time.perf_counter()
                list(pool.map(lambda i: echoes[i].roundtrip(src, sinks[i], ups[i], downs[i], chunk), range(2)))
                return time.perf_counter() - t

            def ps_dense():
                nonlocal version
                t = time.perf_counter()
                res = client.push(grads, version=version)
                version, changed = client.pull_dense(version, out=params)  # in place, as a training loop would
                elapsed = time.perf_counter() - t
                assert res.accepted and changed is not None and len(changed) == len(params)
                return elapsed

            emb_rows = torch.empty(len(ids), args.emb_dim)  # reused, like the dense pull's out= and the echo's sinks

            def ps_pull():
                t = time.perf_counter()
                client.pull_embedding("emb", ids, out=emb_rows)
                return time.perf_counter() - t

            def ps_push():
                t = time.perf_counter()
                client.push(sparse_grads={"emb": (ids, emb_grad)})
                return time.perf_counter() - t

            raw(per_ps, per_ps), ps_dense(), ps_pull(), ps_push()  # warm-up: connections, allocator, caches
            runs = {"raw_dense_s": [], "ps_dense_s": [], "raw_emb_pull_s": [], "raw_emb_push_s": [],
                    "ps_emb_pull_s": [], "ps_emb_push_s": []}
            for r in range(args.repeats):
                runs["raw_dense_s"].append(charged("raw_dense", lambda: raw(per_ps, per_ps)))
                runs["ps_dense_s"].append(charged("ps_dense", ps_dense))
                runs["raw_emb_pull_s"].append(charged("raw_emb_pull", lambda: raw(
                    [n * 8 for n in emb_ps], [n * row_bytes for n in emb_ps])))
                runs["raw_emb_push_s"].append(charged("raw_emb_push", lambda: raw(
                    [n * (8 + row_bytes) for n in emb_ps], [64, 64])))
                runs["ps_emb_pull_s"].append(charged("ps_emb_pull", ps_pull))
                runs["ps_emb_push_s"].append(charged("ps_emb_push", ps_push))
                log(f"repeat {r + 1}/{args.repeats}: " + ", ".join(f"{k}={v[-1]:.3f}" for k, v in runs.items()))
            client.close()
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=30)

    med = {k: statistics.median(v) for k, v in runs.items()}
    moved = 2 * total / 1e6  # MB pushed + pulled per dense step
    n = len(ids)
    result = {
        "bench": "ps",
        "config": {"dense_mib": round(total / (1 << 20), 2), "dense_bytes_per_ps": per_ps, "chunk_bytes": chunk,
                   "num_ps": 2, "mode": "async", "optimizer": "sgd", "emb_ids": n, "emb_dim": args.emb_dim,
                   "emb_order": args.emb_order, "durable": args.durable,
                   "wal_fsync": args.wal_fsync,
                   "repeats": args.repeats, "cpus": os.cpu_count()},
        "dense": {"ps_push_pull_MBps": round(moved / med["ps_dense_s"], 1),
                  "raw_grpc_MBps": round(moved / med["raw_dense_s"], 1),
                  "ratio": round(med["raw_dense_s"] / med["ps_dense_s"], 3)},
        "embedding": {"ps_pull_rows_per_s": round(n / med["ps_emb_pull_s"]),
                      "raw_pull_rows_per_s": round(n / med["raw_emb_pull_s"]),
                      "pull_ratio": round(med["raw_emb_pull_s"] / med["ps_emb_pull_s"], 3),
                      "ps_push_rows_per_s": round(n / med["ps_emb_push_s"]),
                      "raw_push_rows_per_s": round(n / med["raw_emb_push_s"]),
                      "push_ratio": round(med["raw_emb_push_s"] / med["ps_emb_push_s"], 3)},
        "cpu_ms": {k: {"server": round(1e3 * v[0] / args.repeats, 1), "client": round(1e3 * v[1] / args.repeats, 1)}
                   for k, v in cpu.items()},
        "ps_thread_cpu_ms": {k: {name: round(1e3 * sec / args.repeats, 1) for name, sec in sorted(v.items())
                                 if sec > 0} for k, v in threads.items()},
        "target_ratio": 0.70,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "runs": {k: [round(x, 4) for x in v] for k, v in runs.items()},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
