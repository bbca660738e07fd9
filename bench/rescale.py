"""flextrain rescale benchmark: recovery and join times, flextrain vs. torchrun's elastic agent and torchft.

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
  the JSON breaks it down (``recovery_breakdown_median_s``): detect (kill -> the
  survivor's failed collective), reform (-> the master forms the next round),
  regroup (-> process group formed, state broadcast unless the round's members
  are in sync: ``recoveries_without_broadcast`` counts those), replay (-> first step);
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

torchft (``bench/rescale/torchft.py``, skipped with the reason in the JSON when
torchft cannot be imported, or with ``--skip-torchft``): three replica groups of
one process (``bench/rescale/torchft_digits.py``) under torchft's Lighthouse;
recovery after a SIGKILL of a replica, join of its replacement, and steady
steps/s of flextrain vs torchft measured interleaved (``bench/rescale/steady.py``).

The parts live in ``bench/rescale/`` (one module per job; see its README).

Usage (repository root)::

    .venv/bin/python bench/rescale.py              # ~4-5 min on 2 cores
    .venv/bin/python bench/rescale.py --kills 2 --torchrun-kills 1 --skip-lost-node --torchft-kills 1 \
        --steady-seconds 10   # ~2.5 min
    .venv/bin/python bench/rescale.py --kills 5 --skip-torchrun --skip-torchft   # flextrain alone, ~1 min

stdout: exactly one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the rescale package beside this file

from rescale.flextrain_case import flextrain_case  # noqa: E402
from rescale.procs import Janitor, log  # noqa: E402
from rescale.report import METHOD, TARGETS, ratios_and_met, torchrun_figures  # noqa: E402
from rescale.steady import steady_case  # noqa: E402
from rescale.torchft_case import torchft_case, torchft_missing  # noqa: E402
from rescale.torchrun_cases import killed_worker_case, lost_node_case  # noqa: E402


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=5, help="flextrain kills (each followed by a replacement joining)")
    p.add_argument("--torchrun-kills", type=int, default=2, help="killed-worker repeats under one torchrun agent (<= 3)")
    p.add_argument("--skip-lost-node", action="store_true", help="skip torchrun's lost-node/new-node case (~2.5 min)")
    p.add_argument("--skip-torchrun", action="store_true",
                   help="skip the torchrun baseline (flextrain's figures alone, e.g. for before/after runs)")
    p.add_argument("--timeout", type=float, default=120.0, help="bound of every wait, seconds")
    p.add_argument("--settle", type=float, default=1.0, help="seconds of steady training before each event")
    p.add_argument("--skip-torchft", action="store_true", help="skip the torchft baseline")
    p.add_argument("--torchft-kills", type=int, default=3, help="torchft replicas killed (each replaced)")
    p.add_argument("--torchft-heartbeat-timeout-ms", type=int, default=None,
                   help="the torchft Lighthouse's heartbeat timeout (default: torchft's own, 5000)")
    p.add_argument("--steady-seconds", type=float, default=30.0,
                   help="interleaved steady flextrain vs torchft, seconds (0: skip)")
    p.add_argument("--window", type=float, default=0.5, help="turn length of the interleaved steady figure, s")
    p.add_argument("--work-dir", help="keep logs and stamps here (default: a temp dir, removed)")
    args = p.parse_args(argv)
    for flag, value, low in (("--kills", args.kills, 1), ("--torchft-kills", args.torchft_kills, 1),
                             ("--steady-seconds", args.steady_seconds, 0), ("--window", args.window, 0.05)):
        if value < low:
            p.error(f"{flag} must be at least {low}, got {value}")
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
        skipped = {"lost_node_recovery_s": None, "join_samples": [], "samples": [], "details": {}}
        kw = killed_worker_case(args, work, data_pt, janitor) if not args.skip_torchrun \
            else {**skipped, "error": "skipped (--skip-torchrun)"}
        ln = (lost_node_case(args, work, data_pt, janitor) if not (args.skip_lost_node or args.skip_torchrun)
              else {**skipped, "error": "skipped (--skip-lost-node)"})
        why_not = "skipped (--skip-torchft)" if args.skip_torchft else torchft_missing()
        if why_not:
            log(f"torchft: {why_not}")
            tf = {"skipped": why_not}
        else:
            tf = torchft_case(args, work, data_pt, janitor)
            tf["steady"] = (steady_case(args, work, data_dir, data_pt, janitor) if args.steady_seconds > 0
                            else {"skipped": "--steady-seconds 0"})
    finally:
        janitor.cleanup()
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)

    tr = torchrun_figures(kw, ln)
    if args.skip_torchrun:
        tr["skipped"] = "--skip-torchrun"
    ratios, met = ratios_and_met(ft, tr, tf)
    out.update({
        "flextrain": ft, "torchrun": tr, "torchft": tf, "ratios": ratios, "targets": TARGETS, "met": met,
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
