"""The flextrain side of bench/rescale: kill members of a round of 3, wait for their replacements."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from rescale.analysis import analyse_flextrain
from rescale.procs import PY, Janitor, Timeout, alive, kill_group, kill_pid, log, wait_for
from rescale.stamps import read_status, rnd4

HELPERS = Path(__file__).resolve().parent
ZOO = HELPERS / "zoo_digits.py"
GLOBAL_BATCH = 64
LR = 0.05


def job_cmd(data_dir: Path, job_dir: Path) -> list[str]:
    """A 3-worker AllReduce job of the digits module that trains until it is stopped."""
    return [PY, "-m", "flextrain", "train", "--model-def", f"{ZOO}:Model", "--training-data", str(data_dir / "train"),
            "--workers", "3", "--min-workers", "1", "--max-workers", "4", "--epochs", "100000",
            "--global-batch-size", str(GLOBAL_BATCH), "--lr", str(LR), "--job-dir", str(job_dir),
            "--relaunch-budget", "50", "--no-progress"]


def flextrain_case(args, work: Path, data_dir: Path, janitor: Janitor) -> dict:
    rdir = work / "ft"
    rdir.mkdir()
    job_dir = work / "ft-job"
    env = janitor.env(RESCALE_DIR=str(rdir), FLEXTRAIN_LOG_LEVEL="INFO")
    cmd = job_cmd(data_dir, job_dir)
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
