"""The internal commands, run by flextrain itself in child processes and pods.

``flextrain ps`` runs one parameter-server shard, ``flextrain preflight``
checks a job's module on its first records (the child ``train`` starts before
anything else), ``flextrain worker`` runs one worker of a job's master.
"""

from __future__ import annotations

import argparse

from flextrain.orphans import exit_with_parent


def add_commands(sub) -> None:
    """The ``ps``, ``preflight`` and ``worker`` subcommands."""
    ps = sub.add_parser("ps", help="(internal) run one parameter-server shard (see `flextrain ps -- --help`)",
                        add_help=False)
    ps.add_argument("ps_args", nargs=argparse.REMAINDER)
    ps.set_defaults(fn=cmd_ps)
    pf = sub.add_parser("preflight", help="(internal) check a job's module on its first records (what "
                                          "`flextrain train` runs in a child); prints JSON lines")
    pf.add_argument("--job-spec-json", required=True, metavar="JSON", help="the job's JobSpec as JSON")
    pf.set_defaults(fn=cmd_preflight)
    w = sub.add_parser("worker", help="(internal) run a worker process")
    w.add_argument("--master", required=True, metavar="HOST:PORT", help="the job master's gRPC address")
    w.add_argument("--worker-id", required=True, help="this worker's id, given by the master that launched it")
    w.add_argument("--spare", action="store_true",
                   help="start as a spare (--spare-workers): build the model, then park until the master takes it")
    w.set_defaults(fn=cmd_worker)


def cmd_ps(args) -> int:
    from flextrain.ps.main import main as ps_main

    return ps_main(args.ps_args)


def cmd_preflight(args) -> int:
    from flextrain.worker.preflight import child_main

    exit_with_parent()
    return child_main(args.job_spec_json)


def cmd_worker(args) -> int:
    from flextrain.worker.collective import exit_unless_torn_down
    from flextrain.worker.main import run_worker

    code = run_worker(args.master, args.worker_id, spare=args.spare)
    exit_unless_torn_down(code)  # a given-up collective's teardown would hold the exit until its timeout
    return code
