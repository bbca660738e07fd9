"""flextrain rescale benchmark: recovery and join times, flextrain vs. torchrun's elastic agent.

One run, one model (64 -> 64 -> 10 MLP, SGD with momentum), one data set (the
scikit-learn digits training split), one global batch (64), one clock
(``time.time()`` on this machine). Every committed optimizer step of every
process appends ``"<time> <n>"`` to a per-process file, so all figures are
differences of wall-clock timestamps written by the processes themselves.

flextrain (``flextrain train --workers 3 --min-workers 1 --max-workers 4``,
``bench/rescale/zoo_digits.py``):

* recovery: SIGKILL one member of a steadily training round of 3 (ranks
  rotate, rank 0 included); recovery = first step committed by a survivor in
  the round formed after the kill, minus the kill time;
* join: the master relaunches a replacement for every killed worker; join =
  the replacement's first committed step minus its registration time (the
  ``"<id> registered with master"`` line of ``logs/worker-N.log``, INFO with
  ``FLEXTRAIN_LOG_LEVEL=INFO``). Also reported: from the master's
  ``"launched worker-N"`` log line (process start, torch import included).

torchrun (``python -m torch.distributed.run``, c10d rendezvous,
``--max-restarts=3``, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) running
``bench/rescale/ddp_digits.py`` (plain DDP over gloo, checkpoint every 10
steps, resume on every (re)start), torch's default rendezvous timeouts:

* killed worker: one agent ``--nnodes=1 --nproc-per-node=2``; SIGKILL one
  worker process; recovery = first step of the restarted worker group minus
  the kill time (repeated ``--torchrun-kills`` times, ranks alternating);
* lost node: agents ``--nnodes=1:3 --nproc-per-node=1``: A (hosts the c10d
  store, ``--rdzv-conf is_host=1``) starts alone; agent B joins (join sample);
  B's agent and its worker are SIGKILLed (a lost node; recovery = first step
  of A's restarted worker minus the kill time); agent C joins (join sample).
  join = first step of the new agent's worker minus the agent's start.

Every wait is bounded (``--timeout``); a case that does not finish in time is
reported as null with the reason. Every process started (and every process
that inherited this run's marker environment variable) is killed at the end,
also on errors.

Usage (repository root)::

    .venv/bin/python bench/rescale.py              # ~4-5 min on 2 cores
    .venv/bin/python bench/rescale.py --kills 2 --torchrun-kills 1 --skip-lost-node   # ~1.5 min

stdout: exactly one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
HELPERS = HERE / "rescale"
ZOO = HELPERS / "zoo_digits.py"
DDP_SCRIPT = HELPERS / "ddp_digits.py"
PY = sys.executable

GLOBAL_BATCH = 64
LR = 0.05
MARKER = "RESCALE_RUN"  # every process we start inherits MARKER=<run id>: how leftovers are found

TARGETS = {
    "flextrain_recovery_s_max": 1.0,
    "flextrain_join_s_max": 1.0,
    "torchrun_killed_worker_over_flextrain_recovery_min": 20.0,
}

METHOD = (
    "All times are differences of time.time() stamps on one machine. Step stamps: the optimizer of every "
    "process appends (time, n) after each optimizer.step() (flextrain: bench/rescale/zoo_digits.py, called only "
    "for committed all-reduce steps; torchrun: bench/rescale/ddp_digits.py, after DDP backward + step). "
    "Same model (64-64-10 MLP, SGD momentum 0.9, lr 0.05), digits training split, global batch 64, 1 torch "
    "thread per process. flextrain recovery: SIGKILL of one member of a steady round of 3 (ranks rotating) -> "
    "first step of a survivor after the formation of the next round (roundHistory 'time'; the survivors' "
    "in-flight step cannot count). flextrain join: replacement worker's first step - its 'registered with "
    "master' log line (asctime, local time, ms precision, parsed to epoch seconds; cross-checked against "
    "the module-import stamp written right after registration: registered_to_import_s). join_from_launch: "
    "from the master's 'launched worker-N' log line (includes python + torch import of the new process). "
    "torchrun: python -m torch.distributed.run, --rdzv-backend=c10d on 127.0.0.1, --max-restarts=3, "
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, default rendezvous timeouts (join 600 s, last_call 30 s, "
    "keep-alive 5 s x 3), --monitor-interval default; DDP script checkpoints every 10 steps and resumes on "
    "start. killed worker: --nnodes=1 --nproc-per-node=2, SIGKILL one worker -> first step of the restarted "
    "group. lost node: --nnodes=1:3 --nproc-per-node=1 agents A (is_host=1) and B (is_host=0), SIGKILL of B's "
    "agent process group and its worker -> first step of A's restarted worker. new node join: agent start "
    "(Popen) -> first step of its worker (samples: B joining A, C joining A after B was lost). Medians are "
    "reported; every sample is listed. Waits are bounded by --timeout; a case that did not finish is null with "
    "a reason. Another process using the CPU slows both systems; load_avg_1m_at_start is recorded."
)


def log(msg: str) -> None:
    print(f"[rescale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Timeout(Exception):
    pass


def wait_for(predicate, *, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise Timeout(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summary(samples: list[float]) -> dict:
    vals = [round(v, 4) for v in samples if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0, "samples": []}
    return {"median": round(statistics.median(vals), 4), "min": min(vals), "max": max(vals),
            "n": len(vals), "samples": vals}


def rnd4(v):
    return None if v is None else round(v, 4)


# ---- processes --------------------------------------------------------------------
class Janitor:
    """Tracks the processes this run starts; ``cleanup`` kills them and their descendants."""

    def __init__(self) -> None:
        self.run_id = uuid.uuid4().hex
        self.popens: list[subprocess.Popen] = []
        self.logs: list = []

    def env(self, **extra: str) -> dict:
        return {**os.environ, MARKER: self.run_id, "PYTHONUNBUFFERED": "1", **extra}

    def start(self, cmd: list[str], *, env: dict, log_path: Path) -> subprocess.Popen:
        out = open(log_path, "ab")
        self.logs.append(out)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # its own process group: killpg reaches its children
        self.popens.append(proc)
        return proc

    def marked_pids(self) -> list[int]:
        """Live processes that inherited this run's marker (workers live in their own sessions)."""
        needle = f"{MARKER}={self.run_id}".encode()
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        pids.append(int(entry))
            except OSError:
                continue
        return pids

    def cleanup(self) -> None:
        for proc in self.popens:
            if proc.poll() is None:
                kill_group(proc.pid)
        for pid in self.marked_pids():
            kill_pid(pid)
        for proc in self.popens:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log(f"process {proc.pid} did not exit after SIGKILL")
        deadline = time.monotonic() + 10
        while (left := self.marked_pids()) and time.monotonic() < deadline:
            for pid in left:
                kill_pid(pid)
            time.sleep(0.1)
        for f in self.logs:
            f.close()


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ---- step files and logs ------------------------------------------------------------
def read_steps(path: Path | str) -> list[tuple[float, int]]:
    out = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and line.endswith("\n"):
                    out.append((float(parts[0]), int(parts[1])))
    except OSError:
        pass
    return out


def first_after(steps: list[tuple[float, int]], t: float) -> float | None:
    return next((ts for ts, _ in steps if ts > t), None)


def last_before(steps: list[tuple[float, int]], t: float) -> float | None:
    before = [ts for ts, _ in steps if ts < t]
    return before[-1] if before else None


ASCTIME = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"


def parse_asctime(text: str) -> float:
    """logging's default asctime (local time, ms) -> epoch seconds."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def log_times(path: Path, pattern: str) -> dict[str, float]:
    """``{group(2): asctime}`` for every line matching ``ASCTIME + pattern`` (first occurrence)."""
    rx = re.compile("^" + ASCTIME + pattern)
    found: dict[str, float] = {}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return found
    for line in text.splitlines():
        m = rx.match(line)
        if m and m.group(2) not in found:
            found[m.group(2)] = parse_asctime(m.group(1))
    return found


# ---- flextrain -------------------------------------------------------------------------
def read_status(job_dir: Path) -> dict | None:
    try:
        return json.loads((job_dir / "status.json").read_text())
    except (OSError, ValueError):
        return None


def flextrain_case(args, work: Path, data_dir: Path, janitor: Janitor) -> dict:
    rdir = work / "ft"
    rdir.mkdir()
    job_dir = work / "ft-job"
    env = janitor.env(RESCALE_DIR=str(rdir), FLEXTRAIN_LOG_LEVEL="INFO")
    cmd = [PY, "-m", "flextrain", "train", "--model-def", f"{ZOO}:Model", "--training-data", str(data_dir / "train"),
           "--workers", "3", "--min-workers", "1", "--max-workers", "4", "--epochs", "100000",
           "--global-batch-size", str(GLOBAL_BATCH), "--lr", str(LR), "--job-dir", str(job_dir),
           "--relaunch-budget", "50", "--no-progress"]
    master_log = work / "ft-master.log"
    t0 = time.time()
    master = janitor.start(cmd, env=env, log_path=master_log)
    log(f"flextrain: master pid {master.pid}, job dir {job_dir}")
    result: dict = {"config": {"cmd": " ".join(cmd[1:]), "kills": args.kills}}
    events: list[dict] = []
    error = None

    def status():
        s = read_status(job_dir)
        if master.poll() is not None:
            raise RuntimeError(f"flextrain master exited with {master.returncode}; see {master_log}")
        return s

    def steady(min_round: int):
        s = status()
        if not s or s["phase"] != "Running" or not s["roundHistory"]:
            return None
        r = s["roundHistory"][-1]
        if (r["round"] < min_round or len(r["members"]) != 3 or not all(alive(m["pid"]) for m in r["members"])
                or s["step"] < r["version"] + 20 or time.time() - r["time"] < args.settle):
            return None
        return r

    try:
        rnd = wait_for(lambda: steady(0), timeout=args.timeout, what="3 flextrain workers training")
        result["first_round_after_s"] = rnd4(rnd["time"] - t0)
        ranks = [1, 0, 2]
        for i in range(args.kills):
            if i:
                rnd = wait_for(lambda: steady(events[-1]["replacement_round"]), timeout=args.timeout,
                               what="a steady round of 3 after the replacement joined")
            victim = rnd["members"][ranks[i % 3]]
            t_kill = time.time()
            os.kill(victim["pid"], signal.SIGKILL)
            log(f"flextrain: kill {i + 1}/{args.kills}: SIGKILL {victim['id']} (rank {ranks[i % 3]}, "
                f"pid {victim['pid']}) of round {rnd['round']}")
            old_ids = {m["id"] for m in rnd["members"]}

            def replaced():
                s = status()
                for r in (s or {}).get("roundHistory", []):
                    new = [m["id"] for m in r["members"] if m["id"] not in old_ids]
                    if r["round"] > rnd["round"] and new:
                        return r, new[0]
                return None

            joined, newcomer = wait_for(replaced, timeout=args.timeout, what=f"a replacement after kill {i + 1}")
            events.append({"kill": i + 1, "victim": victim["id"], "victim_rank": ranks[i % 3],
                           "round": rnd["round"], "members": sorted(old_ids), "t_kill": t_kill,
                           "pids": {m["id"]: m["pid"] for m in rnd["members"]},
                           "newcomer": newcomer, "replacement_round": joined["round"]})
            log(f"flextrain: {newcomer} joined in round {joined['round']}")
        # let the last newcomer commit a few steps
        time.sleep(1.0)
    except (Timeout, RuntimeError) as exc:
        error = str(exc)
        log(f"flextrain: {error}")
    finally:
        if master.poll() is None:
            try:
                stop = subprocess.run([PY, "-m", "flextrain", "stop", str(job_dir)], capture_output=True,
                                      text=True, timeout=60, env=janitor.env())
                log(f"flextrain: stop -> {stop.returncode} {stop.stdout.strip()} {stop.stderr.strip()}")
                master.wait(timeout=45)
            except subprocess.TimeoutExpired:
                log("flextrain: master did not exit after stop; killing it")
                kill_group(master.pid)
        for pid in janitor.marked_pids():  # workers live in their own sessions
            kill_pid(pid)

    result.update(analyse_flextrain(job_dir, rdir, master_log, events))
    if error:
        result["error"] = error
    return result


def analyse_flextrain(job_dir: Path, rdir: Path, master_log: Path, events: list[dict]) -> dict:
    s = read_status(job_dir) or {}
    history = s.get("roundHistory", [])
    steps = {Path(p).stem.removeprefix("steps-"): read_steps(p) for p in glob.glob(str(rdir / "steps-*.txt"))}
    registered: dict[str, float] = {}
    for p in glob.glob(str(job_dir / "logs" / "worker-*.log")):
        registered.update(log_times(Path(p), r" \S+ INFO (?:.*? )?(worker-\d+) registered with master"))
    launched = log_times(master_log, r" \S+ INFO (?:.*? )?launched (worker-\d+)")
    imported, opt_built = {}, {}
    for p in glob.glob(str(rdir / "import-*.txt")):
        try:
            imported[Path(p).stem.removeprefix("import-")] = float(Path(p).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    for p in glob.glob(str(rdir / "optimizer-*.txt")):
        try:
            start, took = map(float, Path(p).read_text().split()[:2])
            opt_built[Path(p).stem.removeprefix("optimizer-")] = (start, took)
        except (OSError, ValueError):
            pass

    recov, joins, joins_launch, details = [], [], [], []
    reg_sources = set()
    for e in events:
        t_kill = e["t_kill"]
        d = {k: e[k] for k in ("kill", "victim", "victim_rank", "round", "newcomer")}
        after = [r for r in history if r["round"] > e["round"]]
        rec_round = after[0] if after else None
        survivors = [m for m in e["members"] if m != e["victim"]]
        if rec_round is None or e["victim"] in {m["id"] for m in rec_round["members"]}:
            d["recovery_error"] = "no round without the victim found in roundHistory"
        else:
            firsts = [first_after(steps.get(w, []), max(t_kill, rec_round["time"] - 0.001)) for w in survivors]
            firsts = [f for f in firsts if f is not None]
            naive = [first_after(steps.get(w, []), t_kill) for w in survivors]
            naive = [f for f in naive if f is not None]
            d["survivors_round"] = rec_round["round"]
            pids = {m["id"]: m["pid"] for m in rec_round["members"]}
            d["survivors_kept_their_processes"] = all(pids.get(w) == e["pids"].get(w) for w in survivors)
            d["round_formed_after_kill_s"] = rnd4(rec_round["time"] - t_kill)
            if firsts:
                d["recovery_s"] = rnd4(min(firsts) - t_kill)
                recov.append(min(firsts) - t_kill)
            else:
                d["recovery_error"] = "no survivor step after the kill"
            if naive:
                d["first_survivor_step_after_kill_s"] = rnd4(min(naive) - t_kill)
        n = e["newcomer"]
        n_steps = steps.get(n, [])
        reg = registered.get(n)
        source = "worker log"
        if reg is None and n in imported:
            reg, source = imported[n], "module import stamp"
        if n_steps and reg is not None:
            reg_sources.add(source)
            join = n_steps[0][0] - reg
            joins.append(join)
            d["join_s"] = rnd4(join)
            d["registered_after_kill_s"] = rnd4(reg - t_kill)
            if n in imported:
                d["registered_to_import_s"] = rnd4(imported[n] - reg)
            if n in opt_built:
                d["optimizer_construction_s"] = rnd4(opt_built[n][1])
                d["registered_to_optimizer_built_s"] = rnd4(sum(opt_built[n]) - reg)
            if n in launched:
                joins_launch.append(n_steps[0][0] - launched[n])
                d["join_from_launch_s"] = rnd4(n_steps[0][0] - launched[n])
                d["launch_to_registered_s"] = rnd4(reg - launched[n])
            jr = next((r for r in history if n in {m["id"] for m in r["members"]}), None)
            if jr is not None:
                d["join_round"] = jr["round"]
                d["join_round_formed_after_registration_s"] = rnd4(jr["time"] - reg)
                d["join_round_to_first_step_s"] = rnd4(n_steps[0][0] - jr["time"])
                pauses = []
                for m in jr["members"]:
                    if m["id"] == n:
                        continue
                    st = steps.get(m["id"], [])
                    before, nxt = last_before(st, jr["time"]), first_after(st, jr["time"])
                    if before is not None and nxt is not None:
                        pauses.append(nxt - before)
                if pauses:
                    d["survivors_pause_during_join_s"] = rnd4(max(pauses))
                    d["survivors_stopped_after_registration_s"] = rnd4(
                        max(last_before(steps.get(m["id"], []), jr["time"]) or reg for m in jr["members"]
                            if m["id"] != n) - reg)
        else:
            d["join_error"] = f"newcomer {n}: {'no step' if not n_steps else 'no registration time'}"
        details.append(d)

    rate = None
    all_steps = sorted(ts for st in steps.values() for ts, _ in st)
    if events and history:
        # steady 3-worker rate in the second before the first kill (any member's stamps are one per step)
        first = events[0]
        w = first["members"][0]
        st = [ts for ts, _ in steps.get(w, []) if first["t_kill"] - 1.0 <= ts < first["t_kill"]]
        rate = len(st)
    def col(key):
        return [d[key] for d in details if d.get(key) is not None]

    pauses = col("survivors_pause_during_join_s")
    return {
        "recovery_s": summary(recov),
        "join_s": {**summary(joins), "registration_time_source": sorted(reg_sources) or None},
        "join_from_launch_s": summary(joins_launch),
        "survivors_pause_during_join_s": summary(pauses),
        "join_breakdown_median_s": {
            k: rnd4(statistics.median(col(k))) if col(k) else None
            for k in ("launch_to_registered_s", "registered_to_import_s", "optimizer_construction_s",
                      "registered_to_optimizer_built_s", "survivors_stopped_after_registration_s",
                      "join_round_formed_after_registration_s", "join_round_to_first_step_s")},
        "recovery_breakdown_median_s": {
            "round_formed_after_kill_s": rnd4(statistics.median(col("round_formed_after_kill_s")))
            if col("round_formed_after_kill_s") else None},
        "survivors_kept_their_processes": all(col("survivors_kept_their_processes")) if details else None,
        "steady_steps_per_s_3_workers": rate,
        "steps_recorded": len(all_steps),
        "rounds": s.get("rounds"),
        "final_phase": s.get("phase"),
        "final_message": s.get("message"),
        "events": s.get("events", [])[-10:],
        "details": details,
    }


# ---- torchrun ----------------------------------------------------------------------------
def read_procs(tdir: Path) -> list[dict]:
    out = []
    for p in glob.glob(str(tdir / "proc-*.json")):
        try:
            info = json.loads(Path(p).read_text())
        except (OSError, ValueError):
            continue
        info["steps"] = read_steps(tdir / f"steps-{info['tag']}-{info['pid']}.txt")
        out.append(info)
    return out


def torchrun_cmd(tdir: Path, data_pt: Path, *, nnodes: str, nproc: int, port: int, run_id: str, tag: str,
                 extra: tuple[str, ...] = ()) -> list[str]:
    return [PY, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
            "--max-restarts=3", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}",
            *extra, str(DDP_SCRIPT), "--data", str(data_pt), "--out", str(tdir), "--ckpt", str(tdir / "ckpt.pt"),
            "--tag", tag, "--global-batch", str(GLOBAL_BATCH), "--lr", str(LR), "--ckpt-every", "10"]


def torchrun_env(janitor: Janitor, tdir: Path) -> dict:
    return janitor.env(RESCALE_DIR=str(tdir), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", OMP_NUM_THREADS="1",
                       LOGLEVEL="INFO")


def stepping(procs: list[dict], settle: float) -> bool:
    """Every process is alive, has stepped, and the group has stepped for ``settle`` seconds."""
    if not procs or not all(p["steps"] and alive(p["pid"]) for p in procs):
        return False
    start = max(p["steps"][0][0] for p in procs)
    return time.time() - start >= settle and all(time.time() - p["steps"][-1][0] < 1.0 for p in procs)


def killed_worker_case(args, work: Path, data_pt: Path, janitor: Janitor) -> dict:
    tdir = work / "tr-kw"
    tdir.mkdir()
    cmd = torchrun_cmd(tdir, data_pt, nnodes="1", nproc=2, port=free_port(), run_id="rescale-kw", tag="A")
    agent = janitor.start(cmd, env=torchrun_env(janitor, tdir), log_path=work / "tr-kw-agent.log")
    log(f"torchrun killed worker: agent pid {agent.pid}")
    result: dict = {"cmd": " ".join(cmd[1:]), "samples": [], "details": []}
    try:
        def generation(r: int):
            if agent.poll() is not None:
                raise RuntimeError(f"torchrun agent exited with {agent.returncode}; see {work / 'tr-kw-agent.log'}")
            procs = read_procs(tdir)
            latest = max((p["restart"] for p in procs), default=-1)
            procs = [p for p in procs if p["restart"] == latest]
            return procs if latest >= r and len(procs) == 2 and stepping(procs, args.settle) else None

        gen, r = wait_for(lambda: generation(0), timeout=args.timeout, what="torchrun workers training"), 0
        now = time.time()
        result["steady_steps_per_s"] = len([ts for ts, _ in gen[0]["steps"] if now - 1.5 <= ts < now - 0.5])
        for k in range(args.torchrun_kills):
            victim = next(p for p in gen if p["local_rank"] == (1 if k % 2 == 0 else 0))
            t_kill = time.time()
            os.kill(victim["pid"], signal.SIGKILL)
            log(f"torchrun killed worker: kill {k + 1}/{args.torchrun_kills}: SIGKILL local rank "
                f"{victim['local_rank']} (pid {victim['pid']})")
            before = max((ts for p in gen for ts, _ in read_steps(tdir / f"steps-A-{p['pid']}.txt")), default=None)
            last_step = max((n for p in read_procs(tdir) if p["restart"] == r for _, n in p["steps"]), default=None)
            try:
                new = wait_for(lambda: generation(r + 1), timeout=args.timeout, what="the restarted worker group")
            except Timeout as exc:
                result["details"].append({"kill": k + 1, "error": str(exc)})
                result["error"] = str(exc)
                break
            r = new[0]["restart"]
            first = min(p["steps"][0][0] for p in new)
            starts = min(p["t_start"] for p in new)
            ready = max(p["t_ready"] for p in new)
            result["samples"].append(first - t_kill)
            result["details"].append({
                "kill": k + 1, "victim_local_rank": victim["local_rank"], "recovery_s": rnd4(first - t_kill),
                "new_processes_started_after_kill_s": rnd4(starts - t_kill),
                "cold_start_to_ready_s": rnd4(ready - starts),
                "ready_to_first_step_s": rnd4(first - ready),
                "last_step_before_kill_s_before": rnd4(t_kill - before) if before else None,
                "steps_redone_from_checkpoint": (last_step - new[0]["resumed_step"]) if last_step else None,
            })
            log(f"torchrun killed worker: recovered in {first - t_kill:.2f}s")
            gen = new
    except (Timeout, RuntimeError) as exc:
        result["error"] = str(exc)
        log(f"torchrun killed worker: {exc}")
    finally:
        kill_group(agent.pid)
        for pid in janitor.marked_pids():
            kill_pid(pid)
    return result


def lost_node_case(args, work: Path, data_pt: Path, janitor: Janitor) -> dict:
    tdir = work / "tr-ln"
    tdir.mkdir()
    port = free_port()
    env = torchrun_env(janitor, tdir)
    agents: dict[str, subprocess.Popen] = {}
    started: dict[str, float] = {}
    result: dict = {"lost_node_recovery_s": None, "join_samples": [], "details": {}}

    def start(tag: str, is_host: int) -> None:
        cmd = torchrun_cmd(tdir, data_pt, nnodes="1:3", nproc=1, port=port, run_id="rescale-ln", tag=tag,
                           extra=(f"--rdzv-conf=is_host={is_host}",))
        started[tag] = time.time()
        agents[tag] = janitor.start(cmd, env=env, log_path=work / f"tr-ln-agent-{tag}.log")
        result.setdefault("cmd", " ".join(cmd[1:]))
        log(f"torchrun lost node: agent {tag} started (pid {agents[tag].pid})")

    def node_procs(tag: str, since: float = 0.0) -> list[dict]:
        if agents["A"].poll() is not None:
            raise RuntimeError(f"agent A exited with {agents['A'].returncode}; see {work / 'tr-ln-agent-A.log'}")
        return [p for p in read_procs(tdir) if p["tag"] == tag and p["t_start"] > since]

    def newest_stepping(tags: list[str], since: float):
        """The latest worker of each node in ``tags`` (started after ``since``), all stepping together."""
        group = []
        for tag in tags:
            procs = [p for p in node_procs(tag, since) if alive(p["pid"])]
            if not procs:
                return None
            group.append(max(procs, key=lambda p: p["t_start"]))
        return group if stepping(group, args.settle) else None

    def join(tag: str, survivor: str) -> None:
        t0 = time.time()
        start(tag, 0)
        try:
            group = wait_for(lambda: newest_stepping([survivor, tag], t0), timeout=args.timeout,
                             what=f"agent {tag}'s worker training with {survivor}'s")
        except Timeout as exc:
            result["details"][f"join_{tag}"] = {"error": str(exc)}
            raise
        mine = next(p for p in group if p["tag"] == tag)
        other = next(p for p in group if p["tag"] == survivor)
        sample = mine["steps"][0][0] - started[tag]
        result["join_samples"].append(sample)
        prev = [p for p in node_procs(survivor) if p["t_start"] < t0]
        last_old = max((ts for p in prev for ts, _ in p["steps"] if ts < other["t_start"]), default=None)
        result["details"][f"join_{tag}"] = {
            "join_s": rnd4(sample),
            "new_agent_worker_started_after_agent_start_s": rnd4(mine["t_start"] - started[tag]),
            "survivor_worker_restarted_after_agent_start_s": rnd4(other["t_start"] - started[tag]),
            "survivor_pause_s": rnd4(other["steps"][0][0] - last_old) if last_old else None,
            "world_size": mine["world_size"],
        }
        log(f"torchrun lost node: agent {tag} joined in {sample:.2f}s")

    try:
        start("A", 1)
        group = wait_for(lambda: newest_stepping(["A"], 0.0), timeout=args.timeout, what="agent A's worker training")
        result["details"]["single_agent_first_step_after_start_s"] = rnd4(group[0]["steps"][0][0] - started["A"])
        join("B", "A")
        # lost node: B's agent (its process group) and B's worker (its own session) at once
        victims = [p["pid"] for p in node_procs("B") if alive(p["pid"])]
        t_kill = time.time()
        kill_group(agents["B"].pid)
        for pid in victims:
            kill_pid(pid)
        log(f"torchrun lost node: SIGKILL agent B (pgid {agents['B'].pid}) and its worker(s) {victims}")
        try:
            group = wait_for(lambda: newest_stepping(["A"], t_kill), timeout=args.timeout,
                             what="agent A's restarted worker training without B")
        except Timeout as exc:
            result["details"]["lost_node"] = {"error": str(exc) + " (torch's default rendezvous timeouts)"}
            raise
        a = group[0]
        rec = a["steps"][0][0] - t_kill
        result["lost_node_recovery_s"] = rnd4(rec)
        result["details"]["lost_node"] = {
            "recovery_s": rnd4(rec), "survivor_worker_restarted_after_kill_s": rnd4(a["t_start"] - t_kill),
            "survivor_ready_after_kill_s": rnd4(a["t_ready"] - t_kill), "world_size": a["world_size"],
        }
        log(f"torchrun lost node: recovered in {rec:.2f}s")
        join("C", "A")
    except (Timeout, RuntimeError) as exc:
        result["error"] = str(exc)
        log(f"torchrun lost node: {exc}")
    finally:
        for proc in agents.values():
            kill_group(proc.pid)
        for pid in janitor.marked_pids():
            kill_pid(pid)
    return result


# ---- main ------------------------------------------------------------------------------------
def write_data(work: Path) -> tuple[Path, Path]:
    import torch

    from flextrain.data import read_records
    from flextrain.data.digits import decode_digits, write_digits

    data_dir = work / "digits"
    write_digits(data_dir)
    records = []
    for f in sorted((data_dir / "train").glob("*.rio")):
        records.extend(read_records(f))
    x, y = decode_digits(records)
    data_pt = work / "digits-train.pt"
    torch.save({"x": torch.from_numpy(x), "y": torch.from_numpy(y)}, data_pt)
    return data_dir, data_pt


def ratio(a, b):
    return round(a / b, 2) if a is not None and b else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=5, help="flextrain kills (each followed by a replacement joining)")
    p.add_argument("--torchrun-kills", type=int, default=2, help="killed-worker repeats under one torchrun agent (<= 3)")
    p.add_argument("--skip-lost-node", action="store_true", help="skip torchrun's lost-node/new-node case (~2.5 min)")
    p.add_argument("--timeout", type=float, default=120.0, help="bound of every wait, seconds")
    p.add_argument("--settle", type=float, default=1.0, help="seconds of steady training before each event")
    p.add_argument("--work-dir", help="keep logs and stamps here (default: a temp dir, removed)")
    args = p.parse_args(argv)
    args.torchrun_kills = max(1, min(3, args.torchrun_kills))

    import torch

    def terminated(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")  # unwinds through the finally blocks: processes are killed

    signal.signal(signal.SIGTERM, terminated)
    t_begin = time.time()
    load_at_start = round(os.getloadavg()[0], 2)
    work = Path(args.work_dir).resolve() if args.work_dir else Path(tempfile.mkdtemp(prefix="rescale-"))
    work.mkdir(parents=True, exist_ok=True)
    janitor = Janitor()
    out: dict = {"bench": "rescale"}
    try:
        data_dir, data_pt = write_data(work)
        log(f"work dir {work}")
        ft = flextrain_case(args, work, data_dir, janitor)
        log(f"flextrain: recovery {ft['recovery_s']['samples']}, join {ft['join_s']['samples']}")
        kw = killed_worker_case(args, work, data_pt, janitor)
        ln = (lost_node_case(args, work, data_pt, janitor) if not args.skip_lost_node
              else {"lost_node_recovery_s": None, "join_samples": [], "error": "skipped (--skip-lost-node)"})
    finally:
        janitor.cleanup()
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)

    kw_s = summary(kw["samples"])
    join_s = summary(ln["join_samples"])
    tr = {
        "killed_worker_recovery_s": kw_s["median"],
        "killed_worker_recovery_samples": kw_s["samples"],
        "lost_node_recovery_s": ln["lost_node_recovery_s"],
        "new_node_join_s": join_s["median"],
        "new_node_join_samples": join_s["samples"],
        "killed_worker_steady_steps_per_s": kw.get("steady_steps_per_s"),
        "killed_worker_details": kw["details"],
        "lost_node_details": ln.get("details", {}),
        "errors": {k: v for k, v in (("killed_worker", kw.get("error")), ("lost_node", ln.get("error"))) if v},
        "config": {"killed_worker_cmd": kw.get("cmd"), "lost_node_cmd": ln.get("cmd"),
                   "env": {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1"}},
    }
    fr, fj, fjl = ft["recovery_s"]["median"], ft["join_s"]["median"], ft["join_from_launch_s"]["median"]
    ratios = {
        "torchrun_killed_worker_over_flextrain_recovery": ratio(tr["killed_worker_recovery_s"], fr),
        "torchrun_lost_node_over_flextrain_recovery": ratio(tr["lost_node_recovery_s"], fr),
        "torchrun_new_node_join_over_flextrain_join": ratio(tr["new_node_join_s"], fj),
        "torchrun_new_node_join_over_flextrain_join_from_launch": ratio(tr["new_node_join_s"], fjl),
    }
    r_kw = ratios["torchrun_killed_worker_over_flextrain_recovery"]
    met = {
        "flextrain_recovery_median_le_1s": fr is not None and fr <= TARGETS["flextrain_recovery_s_max"],
        "flextrain_recovery_every_sample_le_1s": bool(ft["recovery_s"]["samples"]) and
        ft["recovery_s"]["max"] <= TARGETS["flextrain_recovery_s_max"],
        "flextrain_join_median_le_1s": fj is not None and fj <= TARGETS["flextrain_join_s_max"],
        "flextrain_join_every_sample_le_1s": bool(ft["join_s"]["samples"]) and
        ft["join_s"]["max"] <= TARGETS["flextrain_join_s_max"],
        "torchrun_killed_worker_at_least_20x_flextrain_recovery": r_kw is not None and
        r_kw >= TARGETS["torchrun_killed_worker_over_flextrain_recovery_min"],
    }
    out.update({
        "flextrain": ft, "torchrun": tr, "ratios": ratios, "targets": TARGETS, "met": met,
        "all_met": all(met.values()),
        "environment": {"torch": torch.__version__, "python": sys.version.split()[0], "cpus": os.cpu_count(),
                        "load_avg_1m_at_start": load_at_start},
        "elapsed_s": round(time.time() - t_begin, 1),
        "method": METHOD,
    })
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
