"""``flextrain`` command line: train, run, status, scale, stop, suspend, resume, evaluate, predict, operator, master, data, validate, worker, ps.

This package assembles the parser from one module per command group and runs
the command (``main``, the ``flextrain`` console script):

* flextrain.cli.grpc_quiet -- gRPC's C core at ERROR in a flextrain process (imported first)
* flextrain.cli.common -- what several command modules share (CLIError, HelpFormatter, job names, paths)
* flextrain.cli.train -- ``train`` (its flags, the job spec, ``--resume``, the local run)
* flextrain.cli.run -- ``run SCRIPT ARGS``: an elastic script job, run locally
* flextrain.cli.jobs -- ``status``, ``stop``, ``scale``, ``suspend``, ``resume`` of a local job
* flextrain.cli.plot -- ``plot``: a job's recorded history (events.jsonl) as a picture
* flextrain.cli.evaluate -- ``evaluate`` and ``predict``
* flextrain.cli.kubernetes -- ``--backend kubernetes`` / ``--namespace``: the commands on ElasticJobs
* flextrain.cli.kubernetes_inference -- ``evaluate|predict --backend kubernetes``: evaluation/prediction ElasticJobs
* flextrain.cli.cluster -- ``operator`` and ``master``, what runs inside the cluster
* flextrain.cli.data -- ``data digits|ctr``
* flextrain.cli.convert -- ``data convert|inspect`` (under ``data``)
* flextrain.cli.internal -- ``worker``, ``ps``, ``preflight``
* flextrain.cli.validate -- ``validate``: ElasticJob YAML checked offline as the cluster would

The modules never import this package; it imports them.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from flextrain.cli import grpc_quiet  # noqa: F401 - first: before anything imports grpc (its docstring says why)
from flextrain.cli import (cluster, data, evaluate, internal, jobs, kubernetes, kubernetes_inference, plot, run, train,
                           validate)
from flextrain.cli.common import DEFAULT_JOBS_DIR, CLIError, HelpFormatter, add_data_flags
from flextrain.cli.train import build_spec, cmd_train, given_flags, resume_spec
from flextrain.orphans import exit_with_parent


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flextrain", description="Elastic deep-learning training.")
    parser.add_argument("--log-level", default=os.environ.get("FLEXTRAIN_LOG_LEVEL", "WARNING"),
                        help="DEBUG, INFO, WARNING or ERROR (default: $FLEXTRAIN_LOG_LEVEL, else WARNING)")
    sub = parser.add_subparsers(dest="command", required=True)
    train.add_commands(sub)
    run.add_commands(sub)  # run SCRIPT ARGS: an elastic script job
    jobs.add_commands(sub)  # status, stop, scale, suspend, resume
    parser.train_parser = sub.choices["train"]  # given_flags parses its arguments again
    evaluate.add_commands(sub)  # evaluate, predict
    cluster.add_commands(sub)  # operator, master
    kubernetes.add_commands(sub)  # Kubernetes flags on train/status/stop/scale/suspend/resume
    kubernetes_inference.add_commands(sub)  # ... and on evaluate/predict (spec.jobType evaluation/prediction)
    plot.add_commands(sub)  # plot JOB: the job's history as a picture
    data.add_commands(sub)  # data digits|ctr|convert|inspect
    internal.add_commands(sub)  # ps, preflight, worker
    validate.add_commands(sub)  # validate
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # Whoever read the output stopped reading (`flextrain status | head`): end quietly, as a shell tool
        # does on SIGPIPE; stdout goes to /dev/null, or the interpreter's last flush would raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _main(argv: list[str] | None) -> int:
    parser = make_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "ps":  # its flags belong to flextrain.ps.main's own parser
        args.ps_args = [*extra, *args.ps_args]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.command in ("worker", "ps"):
        exit_with_parent()
    if args.command == "train" and args.resume:
        args.given = given_flags(parser, sys.argv[1:] if argv is None else list(argv), args)
    try:
        return args.fn(args)
    except CLIError as exc:
        print(f"flextrain: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


__all__ = [
    "DEFAULT_JOBS_DIR",
    "CLIError",
    "HelpFormatter",
    "add_data_flags",
    "build_spec",
    "cmd_train",
    "given_flags",
    "main",
    "make_parser",
    "resume_spec",
]
