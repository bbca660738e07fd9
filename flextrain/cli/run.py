"""``flextrain run SCRIPT ARGS``: an elastic script job (the user's own training script).

This process becomes the job's master, as ``flextrain train`` does; each
worker is an agent that runs ``python SCRIPT ARGS`` with torchrun's
environment and restarts it in the new world on every membership change
(docs/script-jobs.md). ``flextrain status/scale/stop`` act on it as on any job.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from flextrain.cli.common import DEFAULT_JOBS_DIR, CLIError, HelpFormatter, abs_path, add_metrics_flags

# The worker flags of `train` that mean the same for a script job, with their defaults.
_WORKER_FLAGS = (
    ("--relaunch-budget", int, 3, "N", "relaunches per worker slot before giving up relaunching"),
    ("--rendezvous-timeout", float, 10.0, "SECONDS", "how long a round waits for stragglers once --min-workers "
                                                     "are present"),
    ("--worker-timeout", float, 60.0, "SECONDS", "silence after which a worker (agent) counts as hung"),
    ("--start-timeout", float, 300.0, "SECONDS", "how long a started worker may take to register"),
    ("--min-workers-timeout", float, 300.0, "SECONDS", "how long the job waits with fewer than --min-workers "
                                                       "alive before it fails"),
)


def add_commands(sub) -> None:
    """The ``run`` subcommand (running cmd_run)."""
    p = sub.add_parser(
        "run", help="run your own training script as an elastic job (torchrun's environment)",
        description=(
            "Run SCRIPT ARGS on --workers workers as an elastic job. Each worker runs the script with "
            "torchrun's environment (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT, ...); when a worker dies, "
            "joins or leaves, every script is restarted in the new world and continues from the last "
            "state it committed with flextrain.elastic.state.State. This process is the job's master; "
            "flextrain status/scale/stop act on the job. Options come before SCRIPT; everything after it "
            "is the script's."),
        formatter_class=HelpFormatter,
        # An option after SCRIPT is the script's: argparse would take a prefix of one of ours (`--n` for
        # --no-progress, ...) as ours and refuse it as ambiguous; our own are given in full.
        allow_abbrev=False,
    )
    p.add_argument("script", nargs="?", metavar="SCRIPT", help="the training script (a .py file)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments")
    g = p.add_argument_group("workers")
    g.add_argument("--workers", type=int, metavar="N", help="number of workers to start (default: 1)")
    g.add_argument("--min-workers", type=int, metavar="N", help="fewest workers a round may run with "
                                                                "(default: --workers)")
    g.add_argument("--max-workers", type=int, metavar="N", help="most workers the job may scale to "
                                                                "(default: --workers)")
    for flag, kind, default, metavar, text in _WORKER_FLAGS:
        g.add_argument(flag, type=kind, default=default, metavar=metavar, help=text)
    g = p.add_argument_group("job")
    g.add_argument("--job-name", metavar="NAME", help="job name (default: from --job-dir, else the script's name)")
    g.add_argument("--job-dir", metavar="DIR",
                   help=f"logs, the script's committed state and status.json (default: ./{DEFAULT_JOBS_DIR}/NAME)")
    g.add_argument("--resume", metavar="JOBDIR", help="run a stopped or failed script job again: the script "
                                                      "continues from its last commit")
    g.add_argument("--overwrite", action="store_true",
                   help="start afresh in a --job-dir that holds an earlier job: its state is moved aside to "
                        "JOBDIR/previous-<time>/, not deleted")
    g.add_argument("--no-progress", action="store_true", help="no live status line")
    add_metrics_flags(g)
    g.add_argument("--no-tensorboard", action="store_true",
                   help="write no TensorBoard event files under JOBDIR/tensorboard/ (docs/observability.md)")
    p.set_defaults(fn=cmd_run)


def build_spec(args):
    """The JobSpec of a new script job from its flags (the script's path made absolute; validated)."""
    from flextrain.job import JobSpec

    if not args.script:
        raise CLIError("SCRIPT is required (unless --resume JOBDIR)")
    script = Path(args.script)
    if not script.is_file():
        raise CLIError(f"script {args.script} does not exist (or is not a file)")
    base = Path(args.job_dir).name if args.job_dir else script.stem
    name = args.job_name or (re.sub(r"[^a-z0-9-]+", "-", base.lower()).strip("-")[:53] or "job")
    job_dir = args.job_dir or str(DEFAULT_JOBS_DIR / name)
    return JobSpec.of(
        name=name, model_def="", job_dir=abs_path(job_dir), script=str(script.resolve()),
        script_args=tuple(args.script_args), workers=1 if args.workers is None else args.workers,
        min_workers=args.min_workers, max_workers=args.max_workers,
        metrics=not args.no_metrics, metrics_port=args.metrics_port, tls=bool(args.tls),
        tensorboard=not args.no_tensorboard,
        **{flag[2:].replace("-", "_"): getattr(args, flag[2:].replace("-", "_")) for flag, *_ in _WORKER_FLAGS},
    ).validate()


def cmd_run(args) -> int:
    from flextrain.job import JobSpecError
    from flextrain.master.jobdir import JobDirError, guard
    from flextrain.master.main import ResumeError, run_master
    from flextrain.master.resume import resumed_spec

    if args.resume and args.overwrite:
        raise CLIError("--resume and --overwrite contradict each other: continue the job or start afresh, not both")
    try:
        if args.resume:
            if args.script:
                raise CLIError("--resume runs the stored script; give no SCRIPT")
            given = {key: getattr(args, key) for key in ("workers", "min_workers", "max_workers")
                     if getattr(args, key) is not None}
            resumed = resumed_spec(args.resume, given)
            spec = resumed.spec.validate()
            if not spec.is_script:
                raise CLIError(f"{args.resume} holds a module job: resume it with `flextrain train --resume`")
        else:
            spec = build_spec(args)
        guard(spec.job_dir, resume=bool(args.resume), overwrite=args.overwrite)
    except (JobSpecError, JobDirError) as exc:
        raise CLIError(str(exc)) from exc
    show = sys.stderr.isatty() and not args.no_progress
    try:
        return run_master(spec, show_progress=show, resume=bool(args.resume),
                          changes=resumed.changes if args.resume else ())
    except (ResumeError, JobDirError) as exc:
        raise CLIError(str(exc)) from exc
