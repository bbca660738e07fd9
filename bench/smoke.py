"""Every bench at its smoke size, one after another: ``make bench``, and the CI guard against crashes.

Each bench runs as its own process with its smallest flags (``SMOKE`` below) and must exit 0
with one JSON object on stdout. Its ratios (every number whose key names a ratio or a
comparison, ``*ratio*`` / ``*_vs_*``, and the ``met`` flags, up to three levels down in
its JSON) go to stderr as each bench finishes, and into the one JSON object this driver
prints. At these sizes the ratios are noise: the driver fails (exit 1) only when a bench
crashes, times out or prints something that is not one JSON object, never on a figure.
The figures that count come from the full sizes in bench/README.md.

Left out by default: ``SLOW`` (ddp_steady, flash_checkpoint, rescale, spares), the benches that start
torchrun or several whole jobs; ``--all`` runs them too (~5 more minutes).

Usage: ``.venv/bin/python bench/smoke.py [--all] [--only NAME ...] [--skip NAME ...] [--timeout S]``.
stdout: one JSON object ``{"bench": "smoke", "ok": bool, "seconds": s, "benches": {name: {...}}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> the bench's smoke-size command line (after the script). Smallest sizes that still run
# every side of the bench once; keep the whole list under ~4 minutes on the 2-core machine.
SMOKE: dict[str, list[str]] = {
    "overhead": ["overhead.py", "--method", "runs", "--repeats", "1", "--records", "4096", "--quiet-wait", "0",
                 "--retries", "0"],
    "ps": ["ps.py", "--mb", "4", "--repeats", "1", "--emb-ids", "20000"],
    "ps_wal": ["ps_wal.py", "--pushes", "10", "--mb", "4"],
    "ga_wrapper": ["ga_wrapper.py", "--rounds", "2", "--block", "1", "--features", "8", "--hidden", "16"],
    "infinity_batch": ["infinity_batch.py", "--rounds", "1", "--fit", "16", "--batches", "1"],
    "accelerate": ["accelerate.py", "--rounds", "2", "--cnn-block", "1", "--mlp-block", "1", "--warmup", "1",
                   "--batch", "8", "--hidden", "16", "--features", "8", "--time-limit", "30",
                   "--excluded", "native_dynamo"],
    "data_convert": ["data_convert.py", "--rows", "2000", "--cols", "4", "--shard-size", "100", "--repeats", "1"],
    "master_scale": ["master_scale.py", "--smoke"],
    "kill_detect": ["kill_detect.py", "--rounds", "1", "--extra-mb", "8"],
    "tls": ["tls.py", "--mb", "4", "--emb-ids", "10000", "--repeats", "2"],
    "record_cache": ["record_cache.py", "--mb", "2", "--chunk-mb", "1", "--epochs", "2"],
}
# Left out of the default run (``--all`` adds them): each starts several jobs or torchrun's agent
# and its workers, and takes 1-2.5 min even at these sizes on the 2-core machine, more than the
# ~4 min the whole smoke run may take.
SLOW: dict[str, list[str]] = {
    "ddp_steady": ["ddp_steady.py", "--workers", "2", "--epochs", "4"],
    "flash_checkpoint": ["flash_checkpoint.py", "--epochs", "4", "--every", "10,50"],
    "rescale": ["rescale.py", "--kills", "1", "--torchrun-kills", "1", "--skip-lost-node"],
    "spares": ["spares.py", "--rounds", "1", "--cycles", "1"],
}
# Environment variables of a torchrun/job process that would mislead a bench started inside one.
_DROP_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def log(msg: str) -> None:
    print(f"[smoke] {msg}", file=sys.stderr, flush=True)


def ratios(result: dict) -> dict:
    """The comparison figures of a bench's JSON: numbers (or null: too few samples at this size)
    under keys naming a ratio (``ratio``, ``*_vs_*``, ``vs_*``, ``speedup``) and ``met`` /
    ``meets_target`` flags, up to three levels down, named by their path (``sides.offload.vs_plain``)."""
    found = {}

    def wanted(key: str) -> bool:
        return not key.startswith("target") and not key.endswith("_pairs") and (
            "ratio" in key or "_vs_" in key or key.startswith("vs_") or key in ("met", "meets_target", "speedup"))

    def walk(node: dict, path: str, depth: int) -> None:
        for key, value in node.items():
            name = f"{path}{key}"
            if isinstance(value, dict) and depth < 3:
                if wanted(key):  # e.g. "met": {"p99": false, ...}
                    found.update({f"{name}.{k}": v for k, v in value.items() if isinstance(v, bool | int | float)})
                else:
                    walk(value, f"{name}.", depth + 1)
            elif wanted(key) and (value is None or isinstance(value, bool | int | float)):
                found[name] = value

    walk(result, "", 1)
    return found


def run_one(name: str, args: list[str], *, timeout: float) -> dict:
    """Run one bench; ``{"ok", "seconds", "ratios"}``, or ``"error"`` saying what went wrong."""
    env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
    cmd = [sys.executable, str(HERE / args[0]), *args[1:]]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                             env=env, cwd=HERE.parent)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-2000:]
        return {"ok": False, "seconds": round(time.perf_counter() - t0, 1),
                "error": f"timed out after {timeout:.0f} s", "stderr_tail": tail.decode(errors="replace")
                if isinstance(tail, bytes) else tail}
    seconds = round(time.perf_counter() - t0, 1)
    if out.returncode != 0:
        return {"ok": False, "seconds": seconds, "error": f"exit {out.returncode}", "stderr_tail": out.stderr[-2000:]}
    try:
        result = json.loads(out.stdout)
    except json.JSONDecodeError as exc:
        return {"ok": False, "seconds": seconds, "error": f"stdout is not one JSON object ({exc})",
                "stdout_head": out.stdout[:500]}
    if not isinstance(result, dict):
        return {"ok": False, "seconds": seconds, "error": f"stdout is a JSON {type(result).__name__}, not an object"}
    return {"ok": True, "seconds": seconds, "ratios": ratios(result)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    every = SMOKE | SLOW
    p.add_argument("--all", action="store_true", help=f"also the slow ones: {', '.join(SLOW)}")
    p.add_argument("--only", nargs="+", choices=sorted(every), metavar="NAME", help="run only these benches")
    p.add_argument("--skip", nargs="+", choices=sorted(every), default=[], metavar="NAME",
                   help="leave these out (e.g. those a test already runs at their smoke size)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds one bench may take before it counts as a crash")
    args = p.parse_args(argv)
    names = [n for n in (args.only or (every if args.all else SMOKE)) if n not in args.skip]
    t0 = time.perf_counter()
    benches = {}
    for name in names:
        log(f"{name}: {' '.join(every[name])}")
        benches[name] = res = run_one(name, every[name], timeout=args.timeout)
        log(f"{name}: {'ok' if res['ok'] else 'FAILED: ' + res['error']} in {res['seconds']} s "
            + json.dumps(res.get("ratios", {})))
        if not res["ok"]:
            log(res.get("stderr_tail") or res.get("stdout_head") or "")
    ok = all(r["ok"] for r in benches.values())
    print(json.dumps({"bench": "smoke", "ok": ok, "seconds": round(time.perf_counter() - t0, 1),
                      "note": "smoke sizes: the ratios are noise; bench/README.md has the figures",
                      "benches": benches}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
