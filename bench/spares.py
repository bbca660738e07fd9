"""Warm spares and the zygote: from a job's submission, a scale request or a SIGKILL to the first
committed step of the worker it brings, for three sides of the same job:

* ``fresh``: every worker a fresh ``python -m flextrain worker`` process (``FLEXTRAIN_ZYGOTE=0``),
  no spares: the baseline, what a local job did before the zygote;
* ``zygote``: the default, workers forked from the job's zygote (flextrain/zygote.py), no spares;
* ``spares``: the default with ``--spare-workers 1``.

The job is bench/rescale's (``bench/rescale/zoo_digits.py``: the digits MLP whose optimizer appends
``"<time.time()> <n>"`` to ``steps-<worker id>.txt`` after every committed step), 2 workers
(``--min-workers 1 --max-workers 3``); with ``--framework keras``, its Keras twin
(``bench/rescale/zoo_digits_keras.py``: model_zoo/digits_keras.py with a step-recording Keras SGD,
on the digits as ``tf.train.Example`` records), whose zygote also imports TensorFlow for the workers.
Each job times:

* start: ``flextrain train`` launched -> the job's first committed step (preflight included);

then repeats a cycle ``--cycles`` times:

* scale-up: ``Scale(3)`` sent to the master over gRPC (what ``flextrain scale`` sends once its
  Python has started) -> the first committed step of the worker that joined; then ``Scale(2)``;
* kill: SIGKILL of one of the 2 members (ranks alternating) -> the first committed step of its
  replacement.

Before each event the job trains steadily in a round of 2 (and, with spares, a spare is parked).
The sides take turns job by job (``--rounds`` jobs per side, the order rotating), so drift of this
shared machine over the run reaches every side. Reported: per side and event kind the median and
every sample, and the ratios fresh / zygote and fresh / spares of the medians with a 95 % bootstrap
interval; the memory a parked spare holds (VmRSS and Pss from /proc, next to a training worker's).
Every process started is killed at the end (bench/rescale.py's Janitor).

Usage (repository root)::

    .venv/bin/python bench/spares.py                  # ~5-6 min on 2 cores
    .venv/bin/python bench/spares.py --rounds 1 --cycles 1   # smoke size, ~2 min
    .venv/bin/python bench/spares.py --framework keras       # the same for a Keras module

stdout: exactly one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rescale.flextrain_case import GLOBAL_BATCH, HELPERS, LR, ZOO  # noqa: E402
from rescale.procs import PY, Janitor, Timeout, alive, kill_group, wait_for  # noqa: E402
from rescale.stamps import first_after, read_steps, summary  # noqa: E402

TARGET_S = 0.5  # issue 26: scale request / kill -> the newcomer's first committed step
MODULES = {"pytorch": f"{ZOO}:Model", "keras": f"{HELPERS / 'zoo_digits_keras.py'}:custom_model"}
SIDES = ("fresh", "zygote", "spares")


def log(msg: str) -> None:
    print(f"[spares {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def memory_kib(pid: int) -> dict:
    """VmRSS (all resident pages, shared ones included) and Pss (shared pages split among their users)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            out["rss_kib"] = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        with open(f"/proc/{pid}/smaps_rollup") as f:
            out["pss_kib"] = next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration):
        pass
    return out


class Job:
    """One flextrain job of the benchmark and the master it is driven through."""

    def __init__(self, work: Path, data_dir: Path, janitor: Janitor, *, side: str, timeout: float,
                 settle: float, framework: str) -> None:
        self.rdir = work / "steps"
        self.rdir.mkdir(parents=True)
        self.job_dir = work / "job"
        spares = 1 if side == "spares" else 0
        self.side, self.timeout, self.settle, self.spares = side, timeout, settle, spares
        cmd = [PY, "-m", "flextrain", "train", "--model-def", MODULES[framework], "--training-data",
               str(data_dir / "train"), "--workers", "2", "--min-workers", "1", "--max-workers", "3",
               "--epochs", "100000", "--global-batch-size", str(GLOBAL_BATCH), "--lr", str(LR),
               "--job-dir", str(self.job_dir), "--relaunch-budget", "50", "--no-progress",
               "--spare-workers", str(spares)]
        self.cmd = " ".join(cmd[1:])
        self.master_log = work / "master.log"
        env = janitor.env(RESCALE_DIR=str(self.rdir), **({"FLEXTRAIN_ZYGOTE": "0"} if side == "fresh" else {}))
        self.submitted = time.time()
        self.master = janitor.start(cmd, env=env, log_path=self.master_log)
        self.stub = None

    def status(self) -> dict | None:
        if self.master.poll() is not None:
            raise RuntimeError(f"flextrain master exited with {self.master.returncode}; see {self.master_log}")
        try:
            s = json.loads((self.job_dir / "status.json").read_text())
        except (OSError, ValueError):
            return None
        return s if s.get("phase") == "Running" else None

    def scale(self, workers: int) -> None:
        from flextrain.proto import flextrain_pb2 as pb

        resp = self._master().Scale(pb.ScaleRequest(workers=workers), timeout=30)
        if not resp.accepted:
            raise RuntimeError(f"scale to {workers} refused: {resp.message}")

    def _master(self):
        if self.stub is None:
            import grpc

            from flextrain.proto import flextrain_pb2_grpc as pb_grpc

            self.stub = pb_grpc.MasterStub(grpc.insecure_channel(self.status()["masterAddress"]))
        return self.stub

    def steady(self, size: int, after_round: int = -1):
        """The round, once ``size`` live members have trained ``settle`` seconds in it (and a spare is parked)."""
        s = self.status()
        if not s or not s["roundHistory"]:
            return None
        r = s["roundHistory"][-1]
        parked = s.get("spares", {}).get("parked", 0) if self.spares else 0
        if (r["round"] <= after_round or len(r["members"]) != size or len(s["members"]) != size
                or not all(alive(m["pid"]) for m in r["members"]) or s["step"] < r["version"] + 10
                or time.time() - r["time"] < self.settle or parked < self.spares):
            return None
        return r

    def newcomer_step(self, before: set[str], t: float) -> tuple[str, float] | None:
        """The worker not in ``before`` in the latest round and its first committed step after ``t``."""
        s = self.status()
        for m in (s or {}).get("members", []):
            if m["id"] not in before:
                first = first_after(read_steps(self.rdir / f"steps-{m['id']}.txt"), t)
                if first is not None:
                    return m["id"], first
        return None

    def first_step(self) -> dict:
        """The job's first committed step after its submission."""
        def found():
            stamps = [first_after(read_steps(p), self.submitted) for p in self.rdir.glob("steps-*.txt")]
            return min((t for t in stamps if t is not None), default=None)

        first = wait_for(found, timeout=self.timeout, what="the job's first committed step")
        log(f"{self.side}: start -> first step after {first - self.submitted:.3f}s")
        return {"kind": "start", "seconds": round(first - self.submitted, 4)}

    def event(self, kind: str, cycle: int) -> dict:
        rnd = wait_for(lambda: self.steady(2), timeout=self.timeout, what=f"a steady round of 2 before {kind}")
        members = {m["id"] for m in rnd["members"]}
        parked = (self.status().get("spares") or {}).get("pids", [])
        t = time.time()
        if kind == "scale":
            self.scale(3)
        else:
            victim = rnd["members"][cycle % 2]
            os.kill(victim["pid"], signal.SIGKILL)
        newcomer, first = wait_for(lambda: self.newcomer_step(members, t), timeout=self.timeout,
                                   what=f"the newcomer's first step after {kind}")
        pid = next(m["pid"] for m in self.status()["members"] if m["id"] == newcomer)
        sample = {"kind": kind, "seconds": round(first - t, 4), "newcomer": newcomer, "was_spare": pid in parked}
        log(f"{self.side}: {kind} -> {newcomer} first step after {first - t:.3f}s"
            f"{' (the parked spare)' if sample['was_spare'] else ''}")
        if kind == "scale":
            wait_for(lambda: self.steady(3, rnd["round"]), timeout=self.timeout, what="a steady round of 3")
            self.scale(2)
        return sample

    def spare_memory(self) -> dict:
        s = wait_for(lambda: (s := self.status()) and s.get("spares", {}).get("pids") and s,
                     timeout=self.timeout, what="a parked spare")
        return {"parked_spare": memory_kib(s["spares"]["pids"][0]),
                "training_worker": memory_kib(s["members"][0]["pid"]) if s["members"] else {}}

    def close(self, janitor: Janitor) -> None:
        if self.master.poll() is None:
            try:
                subprocess.run([PY, "-m", "flextrain", "stop", str(self.job_dir)], capture_output=True, text=True,
                               timeout=60, env=janitor.env())
                self.master.wait(timeout=45)
            except subprocess.TimeoutExpired:
                kill_group(self.master.pid)


def run_side(side: str, work: Path, data_dir: Path, janitor: Janitor, args) -> dict:
    job = Job(work, data_dir, janitor, side=side, timeout=args.timeout, settle=args.settle,
              framework=args.framework)
    out: dict = {"cmd": job.cmd, "samples": []}
    try:
        out["samples"].append(job.first_step())
        for cycle in range(args.cycles):
            for kind in ("scale", "kill"):
                out["samples"].append(job.event(kind, cycle))
        if job.spares:
            out["memory"] = job.spare_memory()
    except (Timeout, RuntimeError) as exc:
        out["error"] = str(exc)
        log(f"{side}: {exc}")
    finally:
        job.close(janitor)
    return out


def ratio_ci(base: list[float], new: list[float], *, resamples: int = 4000, seed: int = 0) -> dict:
    """median(base) / median(new) with a 95 % percentile-bootstrap interval (the sides resampled apart)."""
    if not base or not new:
        return {"ratio": None, "ci95": None}
    rng = np.random.default_rng(seed)
    b, n = np.asarray(base), np.asarray(new)
    boot = (np.median(rng.choice(b, size=(resamples, len(b))), axis=1)
            / np.median(rng.choice(n, size=(resamples, len(n))), axis=1))
    return {"ratio": round(statistics.median(base) / statistics.median(new), 2),
            "ci95": [round(float(np.percentile(boot, 2.5)), 2), round(float(np.percentile(boot, 97.5)), 2)]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="jobs per side (the sides take turns)")
    p.add_argument("--cycles", type=int, default=2, help="scale-up + kill cycles per job")
    p.add_argument("--timeout", type=float, default=120.0, help="bound of every wait, seconds")
    p.add_argument("--settle", type=float, default=1.0, help="seconds of steady training before each event")
    p.add_argument("--work-dir", help="keep logs and stamps here (default: a temp dir, removed)")
    p.add_argument("--framework", choices=sorted(MODULES), default="pytorch",
                   help="the digits module's framework: keras is bench/rescale/zoo_digits_keras.py (the zygote "
                        "imports TensorFlow for its workers)")
    p.add_argument("--sides", default=",".join(SIDES),
                   help="the sides to run, comma-separated (default: all three; a ratio needs both of its sides)")
    args = p.parse_args(argv)
    chosen = tuple(side for side in SIDES if side in args.sides.split(","))
    if not chosen or set(args.sides.split(",")) - set(SIDES):
        p.error(f"--sides takes some of {', '.join(SIDES)}, got {args.sides!r}")

    from flextrain.data.digits import write_digits
    from flextrain.data.example import write_digits_examples

    signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(KeyboardInterrupt()))
    t_begin, load_at_start = time.time(), round(os.getloadavg()[0], 2)
    work = Path(args.work_dir).resolve() if args.work_dir else Path(tempfile.mkdtemp(prefix="spares-"))
    janitor = Janitor()
    sides: dict[str, list[dict]] = {side: [] for side in SIDES}
    try:
        data_dir = work / "digits"
        (write_digits_examples if args.framework == "keras" else write_digits)(data_dir)
        for r in range(args.rounds):
            for side in chosen[r % len(chosen):] + chosen[:r % len(chosen)]:
                log(f"round {r + 1}/{args.rounds}: {side}")
                sides[side].append(run_side(side, work / f"{side}-{r}", data_dir, janitor, args))
    finally:
        janitor.cleanup()
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)

    def seconds(side: str, kind: str) -> list[float]:
        return [s["seconds"] for run in sides[side] for s in run["samples"] if s["kind"] == kind]

    out: dict = {"bench": "spares", "framework": args.framework, "target_s": TARGET_S}
    for kind in ("start", "scale", "kill"):
        fresh = seconds("fresh", kind)
        out[kind] = {**{f"{side}_s": summary(seconds(side, kind)) for side in SIDES},
                     "fresh_over_zygote": ratio_ci(fresh, seconds("zygote", kind)),
                     "fresh_over_spares": ratio_ci(fresh, seconds("spares", kind))}
        if kind != "start":
            spare_med = summary(seconds("spares", kind))["median"]
            out[kind]["target_met"] = spare_med is not None and spare_med <= TARGET_S
    out["spare_taken_every_time"] = all(s["was_spare"] for run in sides["spares"] for s in run["samples"]
                                        if s["kind"] != "start")
    out["memory_kib"] = [run["memory"] for run in sides["spares"] if "memory" in run]
    out["errors"] = [run["error"] for side in sides.values() for run in side if "error" in run]
    out["config"] = {**{f"{side}_cmd": sides[side][0]["cmd"] if sides[side] else None for side in SIDES},
                     "rounds": args.rounds, "cycles": args.cycles, "settle_s": args.settle}
    out["environment"] = {"cpus": os.cpu_count(), "load_avg_1m_at_start": load_at_start,
                          "load_avg_1m_at_end": round(os.getloadavg()[0], 2)}
    out["elapsed_s"] = round(time.time() - t_begin, 1)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
