"""The torchrun side of bench/rescale: a killed worker under one agent, a lost node and new nodes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from rescale.flextrain_case import GLOBAL_BATCH, LR
from rescale.procs import PY, Janitor, Timeout, alive, free_port, kill_group, kill_pid, log, wait_for
from rescale.stamps import read_procs, read_steps, rnd4

DDP_SCRIPT = Path(__file__).resolve().parent / "ddp_digits.py"


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
