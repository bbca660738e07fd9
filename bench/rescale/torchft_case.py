"""The torchft side of bench/rescale: three replicas under a Lighthouse; kill one, start its replacement.

recovery: SIGKILL of one replica -> the first step a survivor commits in a quorum without it
(``participants`` < 3 in its stamp: a survivor's in-flight step that committed just before the
kill cannot count). join: the replacement's process start (Popen) -> its first committed step;
``join_from_ready_s``: from the moment its Manager was built (the nearest to flextrain's
registration) -> that step.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import time
from pathlib import Path

from rescale.flextrain_case import GLOBAL_BATCH, LR
from rescale.procs import PY, Janitor, Timeout, alive, free_port, kill_group, kill_pid, log, wait_for
from rescale.stamps import read_procs, rnd4, summary
from rescale.torchrun_cases import stepping

SCRIPT = Path(__file__).resolve().parent / "torchft_digits.py"
REPLICAS = 3


def lighthouse_binary() -> str | None:
    """torchft's Lighthouse server: installed beside this Python, or on PATH."""
    beside = Path(sys.executable).parent / "torchft_lighthouse"
    return str(beside) if beside.exists() else shutil.which("torchft_lighthouse")


def torchft_missing() -> str | None:
    """Why the torchft baseline cannot run here (None: it can)."""
    try:
        importlib.import_module("torchft")
    except Exception as exc:  # noqa: BLE001 - any import failure is a reason to skip, reported as is
        return f"torchft cannot be imported ({type(exc).__name__}: {exc}); pip install 'flextrain[bench]'"
    if lighthouse_binary() is None:
        return "torchft is installed but its torchft_lighthouse binary was not found"
    return None


def torchft_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchft")
    except PackageNotFoundError:
        return None


class TorchftGroup:
    """A Lighthouse and the replica processes of one torchft job, every process through ``janitor``."""

    def __init__(self, *, tdir: Path, data_pt: Path, janitor: Janitor, heartbeat_timeout_ms: int | None) -> None:
        self.tdir, self.data_pt, self.janitor = tdir, data_pt, janitor
        port = free_port()
        self.address = f"http://127.0.0.1:{port}"
        cmd = [lighthouse_binary(), "--min_replicas", "1", "--bind", f"127.0.0.1:{port}"]
        if heartbeat_timeout_ms is not None:
            cmd += ["--heartbeat_timeout_ms", str(heartbeat_timeout_ms)]
        self.lighthouse_cmd = " ".join(cmd[1:])
        self.lighthouse = janitor.start(cmd, env=janitor.env(), log_path=tdir.parent / f"{tdir.name}-lighthouse.log")
        self.launched: dict[str, float] = {}
        self.next_id = 0

    def start_replica(self) -> str:
        tag = f"r{self.next_id}"
        self.next_id += 1
        cmd = [PY, str(SCRIPT), "--data", str(self.data_pt), "--out", str(self.tdir), "--replica", tag,
               "--lighthouse", self.address, "--replicas", str(REPLICAS), "--global-batch", str(GLOBAL_BATCH),
               "--lr", str(LR)]
        self.launched[tag] = time.time()
        self.janitor.start(cmd, env=self.janitor.env(OMP_NUM_THREADS="1", BENCH_STEP_DIR=str(self.tdir)),
                           log_path=self.tdir.parent / f"{self.tdir.name}-{tag}.log")
        return tag

    def live(self) -> list[dict]:
        if self.lighthouse.poll() is not None:
            raise RuntimeError(f"the torchft lighthouse exited with {self.lighthouse.returncode}")
        return [p for p in read_procs(self.tdir) if alive(p["pid"])]

    def steady(self, settle: float) -> list[dict] | None:
        procs = self.live()
        return procs if len(procs) == REPLICAS and stepping(procs, settle) else None

    def stop(self) -> None:
        kill_group(self.lighthouse.pid)
        for p in read_procs(self.tdir):
            kill_pid(p["pid"])


def participants_steps(tdir: Path, tag: str, pid: int) -> list[tuple[float, int]]:
    """``(time, participants)`` of every step the replica committed."""
    out = []
    try:
        with open(tdir / f"steps-{tag}-{pid}.txt") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and line.endswith("\n"):
                    out.append((float(parts[0]), int(parts[2])))
    except OSError:
        pass
    return out


def start_group(args, work: Path, data_pt: Path, janitor: Janitor, name: str) -> TorchftGroup:
    tdir = work / name
    tdir.mkdir()
    group = TorchftGroup(tdir=tdir, data_pt=data_pt, janitor=janitor,
                         heartbeat_timeout_ms=args.torchft_heartbeat_timeout_ms)
    for _ in range(REPLICAS):
        group.start_replica()
    return group


def torchft_case(args, work: Path, data_pt: Path, janitor: Janitor) -> dict:
    group = start_group(args, work, data_pt, janitor, "tf")
    log(f"torchft: lighthouse {group.address}, {REPLICAS} replicas")
    recov, joins, joins_ready, details = [], [], [], []
    result: dict = {"version": torchft_version(), "lighthouse_cmd": group.lighthouse_cmd,
                    "replica_cmd": f"{SCRIPT.name} --replicas {REPLICAS} --global-batch {GLOBAL_BATCH} --lr {LR}"}
    try:
        procs = wait_for(lambda: group.steady(args.settle), timeout=args.timeout, what="3 torchft replicas training")
        now = time.time()
        result["steady_steps_per_s_sequential"] = len([ts for ts, _ in procs[0]["steps"] if now - 1.5 <= ts < now - 0.5])
        for k in range(args.torchft_kills):
            victim = sorted(procs, key=lambda p: p["tag"])[k % REPLICAS]
            survivors = [p for p in procs if p["pid"] != victim["pid"]]
            t_kill = time.time()
            kill_pid(victim["pid"])
            log(f"torchft: kill {k + 1}/{args.torchft_kills}: SIGKILL replica {victim['tag']} (pid {victim['pid']})")

            def recovered():
                firsts = [next((ts for ts, n in participants_steps(group.tdir, p["tag"], p["pid"])
                                if ts > t_kill and n < REPLICAS), None) for p in survivors]
                return min((f for f in firsts if f is not None), default=None)

            d = {"kill": k + 1, "victim": victim["tag"]}
            try:
                first = wait_for(recovered, timeout=args.timeout, what=f"torchft survivors after kill {k + 1}")
            except Timeout as exc:
                d["error"] = str(exc)
                details.append(d)
                raise
            recov.append(first - t_kill)
            d["recovery_s"] = rnd4(first - t_kill)
            log(f"torchft: recovered in {first - t_kill:.3f}s")
            tag = group.start_replica()
            procs = wait_for(lambda: group.steady(args.settle), timeout=args.timeout,
                             what=f"torchft replacement {tag} training with the survivors")
            new = next(p for p in procs if p["tag"] == tag)
            join = new["steps"][0][0] - group.launched[tag]
            joins.append(join)
            d.update({"newcomer": tag, "join_from_launch_s": rnd4(join)})
            if new.get("t_ready"):
                joins_ready.append(new["steps"][0][0] - new["t_ready"])
                d["join_from_ready_s"] = rnd4(joins_ready[-1])
            log(f"torchft: {tag} joined {join:.2f}s after its launch")
            details.append(d)
    except (Timeout, RuntimeError) as exc:
        result["error"] = str(exc)
        log(f"torchft: {exc}")
    finally:
        group.stop()
    result.update({"recovery_s": summary(recov), "join_from_launch_s": summary(joins),
                   "join_from_ready_s": summary(joins_ready), "details": details})
    return result


__all__ = ["TorchftGroup", "start_group", "torchft_case", "torchft_missing"]
