"""``flextrain`` command line: train, status, scale, stop, data, worker, ps."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from pathlib import Path

from flextrain.orphans import exit_with_parent

DEFAULT_JOBS_DIR = Path("flextrain-jobs")


class CLIError(Exception):
    """A user error: printed as `flextrain: error: ...`, exit code 2."""


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help once.

    Not when the help already says what the default is (``(default: --workers)``),
    and not for None/False/[] defaults, which mean "not given" rather than a value:
    ArgumentDefaultsHelpFormatter printed ``(default 1) (default: None)``.
    """

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or not action.option_strings or default is None or default is False
                or default is argparse.SUPPRESS or default == []):
            return text
        return f"{text} (default: %(default)s)"


# ---- train ------------------------------------------------------------------
def _add_train(sub) -> None:
    p = sub.add_parser(
        "train",
        help="run an elastic training job",
        description=(
            "Run an elastic training job. With the local backend this process becomes the job's "
            "master: it shards the data into tasks, launches --workers worker processes, keeps the "
            "global batch fixed whatever the number of live workers, and exits 0 only when the job "
            "succeeded."
        ),
        formatter_class=HelpFormatter,
    )
    g = p.add_argument_group("model and data")
    g.add_argument("--model-def", metavar="MODULE:NAME",
                   help="model-zoo module and model callable: path/to/module.py:Name or package.module.Name")
    g.add_argument("--training-data", metavar="PATH",
                   help="RecordIO or CSV training data (told by content): a directory, a file, a glob "
                        "('data/part-*') or a comma-separated list of files")
    g.add_argument("--validation-data", metavar="PATH",
                   help="records evaluated with eval_metrics_fn at the end of training (like --training-data)")
    add_data_flags(g)
    g.add_argument("--evaluation-steps", type=int, default=0, metavar="N",
                   help="also evaluate on --validation-data every N optimizer steps (0: only at the end)")
    g = p.add_argument_group("workers")
    # No argparse default for the worker counts: --resume must tell a given count from an unset one.
    g.add_argument("--workers", type=int, metavar="N", help="number of workers to start (default: 1)")
    g.add_argument("--min-workers", type=int, metavar="N",
                   help="fewest workers a round may train with (default: --workers)")
    g.add_argument("--max-workers", type=int, metavar="N",
                   help="most workers the job may scale to (default: --workers)")
    g = p.add_argument_group("distribution")
    g.add_argument("--distribution-strategy", choices=("AllReduce", "ParameterServer"), default="AllReduce",
                   help="AllReduce: lockstep workers; ParameterServer: workers push gradients to --ps servers")
    g.add_argument("--ps", type=int, default=0, metavar="N", help="parameter servers to start (ParameterServer only)")
    g.add_argument("--ps-mode", choices=("sync", "async"), default="sync",
                   help="sync: stale pushes are rejected and recomputed; async: every push is applied")
    g.add_argument("--grads-to-wait", type=int, metavar="N",
                   help="pushes a sync PS averages into one update (default: 1)")
    g.add_argument("--ps-checkpoint-steps", type=int, default=20, metavar="N",
                   help="each PS checkpoints every N of its versions (0: only when it stops)")
    g.add_argument("--ps-wal", action=argparse.BooleanOptionalAction, default=True,
                   help="each PS logs every acknowledged change before applying it; --no-ps-wal: "
                        "faster pushes, but a relaunched PS loses the updates since its last checkpoint")
    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=int, default=1, metavar="N", help="passes over the training data")
    g.add_argument("--global-batch-size", type=int, default=64, metavar="N",
                   help="samples per optimizer step, kept fixed as workers come and go")
    g.add_argument("--max-micro-batch", type=int, metavar="N",
                   help="largest batch one worker computes at once; more samples are accumulated "
                        "(default: --global-batch-size)")
    g.add_argument("--lr", "--learning-rate", dest="learning_rate", type=float, metavar="LR",
                   help="learning rate passed to the module's optimizer (default: the module's own)")
    g.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seeds the model's initialisation and the task order of --shuffle")
    g.add_argument("--shuffle", action="store_true", help="shuffle the order of tasks every epoch")
    g.add_argument("--steps-per-task", type=int, default=8, metavar="N",
                   help="optimizer steps per data task (the unit handed out and re-queued)")
    g = p.add_argument_group("job")
    g.add_argument("--job-name", metavar="NAME", help="job name (default: from --job-dir, else the module's name)")
    g.add_argument("--job-dir", metavar="DIR", help=f"logs, checkpoints and status.json (default: ./{DEFAULT_JOBS_DIR}/NAME)")
    g.add_argument("--max-task-retries", type=int, default=3, metavar="N",
                   help="a failing task is retried this often, then the job fails")
    g.add_argument("--checkpoint-steps", type=int, default=0, metavar="N",
                   help="checkpoint every N optimizer steps (0: at the end only)")
    g.add_argument("--rendezvous-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="how long a round waits for stragglers once --min-workers are present")
    g.add_argument("--worker-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="silence after which a worker counts as hung")
    g.add_argument("--start-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="how long a started worker may take to be ready (import the module, build the model "
                        "and optimizer) before it counts as hung")
    g.add_argument("--relaunch-budget", type=int, default=3, metavar="N",
                   help="relaunches per worker slot before giving up relaunching")
    g.add_argument("--min-workers-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="how long the job waits with fewer than --min-workers alive before it fails")
    g.add_argument("--resume", metavar="JOBDIR",
                   help="continue a stopped, failed or finished job from its latest checkpoint (model, optimizer and "
                        "data position); --workers, --epochs (more), --lr, --validation-data, timeouts and budgets may "
                        "be given to change them; other flags are refused (README: Resuming a job)")
    g.add_argument("--overwrite", action="store_true",
                   help="start afresh in a --job-dir that holds an earlier job (which is refused otherwise): "
                        "its state is moved aside to JOBDIR/previous-<time>/, not deleted")
    g.add_argument("--no-progress", action="store_true", help="no live progress bar (log lines instead)")
    g.add_argument("--no-preflight", action="store_true",
                   help="skip preflight: before anything starts, a child process imports the module and checks "
                        "its contract on the first records (model, optimizer, feed, loss, one training step); "
                        "skip it for a module that only works on the workers' hardware")
    g.add_argument("--nan-policy", choices=("fail", "skip-step"), default="fail",
                   help="a NaN or infinite loss or gradient: fail the job naming the step and the last good "
                        "checkpoint, or skip that step (nothing of it is applied) and go on")
    g.add_argument("--preflight-timeout", type=float, metavar="SECONDS",
                   help="how long preflight may take (default: $FLEXTRAIN_PREFLIGHT_TIMEOUT, else 120)")


def add_data_flags(g) -> None:
    """--skip-unknown-files and --csv-header (train, evaluate, predict)."""
    g.add_argument("--skip-unknown-files", action="store_true",
                   help="skip files under the data paths that are not RecordIO or CSV data (and dangling links, "
                        "unreadable files), with a warning naming each; by default such a file is an error")
    g.add_argument("--csv-header", action="store_true",
                   help="the first line of every CSV data file is a header, not a record")


def _job_name(args) -> str:
    if args.job_name:
        return args.job_name
    if args.job_dir:
        base = Path(args.job_dir).name
    else:  # the module's name: path/to/deepfm_torch.py:Model or pkg.deepfm_torch.Model -> deepfm_torch
        target = args.model_def.rsplit(":", 1)[0] if ":" in args.model_def else args.model_def.rsplit(".", 1)[0]
        base = Path(target).stem if target.endswith(".py") else target.rsplit(".", 1)[-1]
    name = re.sub(r"[^a-z0-9-]+", "-", base.lower()).strip("-")
    return name[:53] or "job"


def _abs(path: str | None) -> str | None:
    return str(Path(path).resolve()) if path else None


def _data_abs(path: str | None) -> str | None:
    """A data path made absolute: each part of a comma-separated list (unless the whole path exists)."""
    if not path or "," not in path or Path(path).exists():
        return _abs(path)
    return ",".join(_abs(part.strip()) for part in path.split(",") if part.strip())


def _model_def_abs(spec: str) -> str:
    """Make a file-path --model-def absolute so workers resolve it from any directory."""
    target, sep, name = spec.rpartition(":")
    if sep and (target.endswith(".py") or Path(target).is_file()):
        return f"{Path(target).resolve()}:{name}"
    return spec


def build_spec(args):
    from flextrain.job import JobSpec, Strategy

    name = _job_name(args)
    job_dir = args.job_dir or str(DEFAULT_JOBS_DIR / name)
    return JobSpec(
        name=name, model_def=_model_def_abs(args.model_def), training_data=_data_abs(args.training_data),
        validation_data=_data_abs(args.validation_data), job_dir=_abs(job_dir), workers=1 if args.workers is None else args.workers,
        evaluation_steps=args.evaluation_steps,
        min_workers=args.min_workers, max_workers=args.max_workers, epochs=args.epochs,
        global_batch_size=args.global_batch_size, max_micro_batch=args.max_micro_batch,
        learning_rate=args.learning_rate, seed=args.seed, shuffle=args.shuffle,
        steps_per_task=args.steps_per_task, max_task_retries=args.max_task_retries,
        checkpoint_steps=args.checkpoint_steps, rendezvous_timeout=args.rendezvous_timeout,
        worker_timeout=args.worker_timeout, start_timeout=args.start_timeout, relaunch_budget=args.relaunch_budget,
        min_workers_timeout=args.min_workers_timeout,
        strategy=Strategy(args.distribution_strategy), ps=args.ps, ps_mode=args.ps_mode,
        grads_to_wait=args.grads_to_wait, ps_checkpoint_steps=args.ps_checkpoint_steps,
        ps_wal=args.ps_wal, nan_policy=args.nan_policy, preflight=not getattr(args, "no_preflight", False),
        skip_unknown_files=args.skip_unknown_files, csv_header=args.csv_header,
    )


# flags of `train` that are not JobSpec fields: how each reaches the spec on --resume
_DEST_FIELD = {"distribution_strategy": "strategy", "job_name": "name", "no_preflight": "preflight"}
_RESUME_CLI_ONLY = {"resume", "no_progress", "preflight_timeout", "backend", "fn", "command"}


def given_flags(parser: argparse.ArgumentParser, argv: list[str], args) -> set[str]:
    """The dests of the ``train`` flags given on the command line (a default is not given).

    argparse tells no given value from a default, so the arguments are parsed again into a
    namespace whose every attribute is a sentinel: argparse fills in defaults only for missing ones.
    """
    unset = object()
    namespace = argparse.Namespace(**{dest: unset for dest in vars(args)})
    parser.train_parser.parse_known_args(argv[argv.index("train") + 1:], namespace)
    return {dest for dest, value in vars(namespace).items() if value is not unset}


def resume_spec(args):
    """The stored job of ``--resume DIR`` (re-rooted at DIR) with the changeable flags given applied."""
    from flextrain.job import Strategy
    from flextrain.master.resume import resumed_spec

    given, refused = {}, []
    for dest in sorted(getattr(args, "given", set()) - _RESUME_CLI_ONLY):
        field, value = _DEST_FIELD.get(dest, dest), getattr(args, dest)
        if dest == "no_preflight":
            value = not value
        elif dest == "distribution_strategy":
            value = Strategy(value)
        elif dest in ("validation_data", "training_data"):
            value = _data_abs(value)
        elif dest in ("image", "namespace", "dry_run", "pvc", "master_port"):
            refused.append(f"--{dest.replace('_', '-')}")
            continue
        given[field] = value
    resumed = resumed_spec(args.resume, given, refused=tuple(refused))
    return resumed


def cmd_train(args) -> int:
    from flextrain.data import DataError, DataOptions, make_shards
    from flextrain.job import JobSpecError, Strategy
    from flextrain.master.jobdir import JobDirError, guard
    from flextrain.master.main import run_master
    from flextrain.worker.module import Framework, ModelDefError, load_model_def

    if args.resume and args.overwrite:  # before the stored job is even read
        raise CLIError("--resume and --overwrite contradict each other: continue the job or start afresh, not both")
    if not args.resume:
        missing = [f for f in ("model_def", "training_data") if not getattr(args, f)]
        if missing:
            raise CLIError(f"--{missing[0].replace('_', '-')} is required (unless --resume JOBDIR)")
    try:
        resumed = resume_spec(args) if args.resume else None
        spec = (resumed.spec if resumed else build_spec(args)).validate()
        guard(spec.job_dir, resume=bool(args.resume), overwrite=args.overwrite)  # before anything is written
        if resumed and resumed.moved_from:
            print(f"flextrain: {spec.job_dir} was recorded at {resumed.moved_from}: resuming from its own "
                  "state here", file=sys.stderr)
        if args.preflight_timeout is not None:
            from flextrain.job import check_positive_finite

            check_positive_finite("--preflight-timeout", args.preflight_timeout)
        # Everything checkable is checked before a single process starts; the cheap checks first.
        skipped: list[str] = []
        make_shards(spec.training_data, what="training data", options=DataOptions.of(spec), skipped=skipped)
        if spec.validation_data:
            make_shards(spec.validation_data, what="validation data", options=DataOptions.of(spec), skipped=skipped)
        for warning in skipped:
            print(f"flextrain: warning: {warning}", file=sys.stderr)
        if spec.preflight:  # the contract on real records, in a child: the module is code we cannot trust
            from flextrain.worker.preflight import run_preflight

            run_preflight(spec, timeout=args.preflight_timeout)
        model_def = load_model_def(spec.model_def)  # without preflight, at least names and signatures
        if spec.strategy is Strategy.PARAMETER_SERVER and not spec.preflight:  # else preflight did it
            from flextrain.worker.ps_trainer import check_ps_optimizer

            check_ps_optimizer(model_def, lr=spec.learning_rate)
            if model_def.framework is Framework.TENSORFLOW:
                from flextrain.worker.tf.ps import check_keras_ps_optimizer

                check_keras_ps_optimizer(model_def, lr=spec.learning_rate)
    except (JobSpecError, ModelDefError, DataError, JobDirError) as exc:
        raise CLIError(str(exc)) from exc
    from flextrain.master.main import ResumeError

    show = sys.stderr.isatty() and not args.no_progress
    try:
        return run_master(spec, show_progress=show, resume=bool(args.resume),
                          changes=resumed.changes if resumed else (), moved_from=resumed.moved_from if resumed else None)
    except (ResumeError, JobDirError) as exc:  # JobDirError: another master took the lock meanwhile
        raise CLIError(str(exc)) from exc


# ---- status / stop / scale ----------------------------------------------------
def _job_dir(job: str) -> Path:
    path = Path(job)
    for candidate in (path, DEFAULT_JOBS_DIR / job):
        if (candidate / "status.json").is_file():
            return candidate
    raise CLIError(f"no job {job!r}: neither {path}/status.json nor {DEFAULT_JOBS_DIR / job}/status.json exists")


def _read_status(job: str, *, complete: bool = True) -> dict:
    """status.json of a local job; ``complete``: with every field `flextrain status` prints (else
    stop and scale need only an object with the master's address)."""
    from flextrain.master.status import check_status

    path = _job_dir(job) / "status.json"
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or complete:
            check_status(data, path)
        return data
    except (OSError, ValueError) as exc:
        raise CLIError(f"cannot read {path}: {exc}" if not str(exc).startswith(str(path)) else str(exc)) from exc


def _master_alive(status: dict) -> bool:
    pid = status.get("pid")
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _master_stub(status: dict):
    import grpc

    from flextrain.proto import flextrain_pb2_grpc as pb_grpc

    if status.get("phase") in ("Succeeded", "Failed") or not _master_alive(status):
        raise CLIError(f"job {status.get('name')} is not running (phase {status.get('phase')})")
    if not isinstance(status.get("masterAddress"), str):
        raise CLIError(f"job {status.get('name')}: its status.json names no master address (masterAddress)")
    return pb_grpc.MasterStub(grpc.insecure_channel(status["masterAddress"]))


def cmd_status(args) -> int:
    status = _read_status(args.job)
    if status.get("phase") in ("Pending", "Running") and not _master_alive(status):
        status["message"] = f"master process {status.get('pid')} is gone; status is from its last write"
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True))
        return 0
    p, w = status["progress"], status["workers"]
    print(f"job       {status['name']}  ({status['jobDir']})")
    print(f"phase     {status['phase']}" + (f"  - {status['message']}" if status.get("message") else ""))
    print(f"workers   {w['active']} active / {w['desired']} desired")
    print(f"epoch     {status['epoch']}/{status['epochs']}   step {status['step']}")
    print(f"progress  {p['recordsDone']:,}/{p['recordsTotal']:,} records ({p['percent']}%)")
    for name, value in sorted(status.get("metrics", {}).items()):
        print(f"{name:<9} {value:.4f}" if not isinstance(value, str) else f"{name:<9} {value}")
    if evaluations := status.get("evaluations"):  # the metrics above are the latest evaluation's
        more = f" (of {len(evaluations)} evaluations)" if len(evaluations) > 1 else ""
        print(f"evaluated at step {evaluations[-1]['step']} on {evaluations[-1]['samples']:,} samples{more}")
    from flextrain.master.failures import failure_lines

    for line in failure_lines(status.get("failure")):
        print(line)
    return 0


def cmd_stop(args) -> int:
    from flextrain.proto import flextrain_pb2 as pb

    status = _read_status(args.job, complete=False)
    resp = _master_stub(status).Stop(pb.StopRequest(reason=args.reason), timeout=10)
    print(resp.message)
    return 0 if resp.accepted else 1


def cmd_scale(args) -> int:
    from flextrain.proto import flextrain_pb2 as pb

    status = _read_status(args.job, complete=False)
    resp = _master_stub(status).Scale(pb.ScaleRequest(workers=args.workers), timeout=10)
    if not resp.accepted:  # printed once, by main(), as the error
        raise CLIError(resp.message)
    print(resp.message)
    return 0


# ---- data / worker --------------------------------------------------------------
def _check_data_flags(args) -> None:
    if not 0 < args.validation_fraction < 1:  # also refuses nan
        raise CLIError(f"--validation-fraction must be between 0 and 1 (exclusive), got {args.validation_fraction!r}")
    if getattr(args, "rows", 2) < 2:  # both splits need a record
        raise CLIError(f"--rows must be at least 2, got {args.rows}")


def cmd_data_digits(args) -> int:
    _check_data_flags(args)
    if args.format == "example":  # tf.train.Example records, as ElasticDL modules parse them
        from flextrain.data.example import write_digits_examples as write_digits
    else:
        from flextrain.data.digits import write_digits

    info = write_digits(args.out, validation_fraction=args.validation_fraction, seed=args.seed)
    print(f"wrote {info['train']} training and {info['validation']} validation digits ({args.format}) to {args.out}")
    return 0


def cmd_data_ctr(args) -> int:
    _check_data_flags(args)
    from flextrain.data.ctr import write_ctr

    info = write_ctr(args.out, rows=args.rows, validation_fraction=args.validation_fraction, seed=args.seed)
    print(f"wrote {info['train']} training and {info['validation']} validation click records to {args.out} "
          f"(click rate {info['positive_rate']:.3f})")
    return 0


def cmd_ps(args) -> int:
    from flextrain.ps.main import main as ps_main

    return ps_main(args.ps_args)


def cmd_preflight(args) -> int:
    from flextrain.worker.preflight import child_main

    exit_with_parent()
    return child_main(args.job_spec_json)


def cmd_worker(args) -> int:
    from flextrain.worker.main import run_worker

    return run_worker(args.master, args.worker_id)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flextrain", description="Elastic deep-learning training.")
    parser.add_argument("--log-level", default=os.environ.get("FLEXTRAIN_LOG_LEVEL", "WARNING"),
                        help="DEBUG, INFO, WARNING or ERROR (default: $FLEXTRAIN_LOG_LEVEL, else WARNING)")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train(sub)
    for name, fn, help_ in (("status", cmd_status, "show a job's status"),
                            ("stop", cmd_stop, "stop a running job"),
                            ("scale", cmd_scale, "change the number of workers of a running job")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("job", metavar="JOB", help="job name or job directory")
        if name == "status":
            p.add_argument("--json", action="store_true", help="print status.json")
        if name == "stop":
            p.add_argument("--reason", default="stopped by user (flextrain stop)",
                           help="recorded as the job's final message")
        if name == "scale":
            p.add_argument("workers", type=int, metavar="N",
                           help="the number of workers wanted, within the job's --min-workers..--max-workers")
        p.set_defaults(fn=fn)
    sub.choices["train"].set_defaults(fn=cmd_train)
    parser.train_parser = sub.choices["train"]  # given_flags parses its arguments again
    from flextrain.cli_eval import add_commands as add_eval_commands

    add_eval_commands(sub)  # evaluate, predict
    from flextrain.cli_k8s import add_commands as add_k8s_commands

    add_k8s_commands(sub)  # operator, master; Kubernetes flags on train/status/stop/scale
    data = sub.add_parser("data", help="write demo data sets").add_subparsers(dest="dataset", required=True)
    d = data.add_parser("digits", help="scikit-learn's handwritten digits as RecordIO train/validation files",
                        formatter_class=HelpFormatter)
    d.add_argument("--out", required=True, metavar="DIR", help="writes DIR/train and DIR/validation")
    d.add_argument("--validation-fraction", type=float, default=0.2, metavar="F",
                   help="share of the records held out for validation, between 0 and 1")
    d.add_argument("--seed", type=int, default=0, metavar="N", help="seeds the train/validation split")
    d.add_argument("--format", choices=("raw", "example"), default="raw",
                   help="raw: 65-byte records (64 pixels + label); example: serialized tf.train.Example "
                        "with features image (64 floats) and label (int64)")
    d.set_defaults(fn=cmd_data_digits)
    d = data.add_parser("ctr", help="a synthetic click log (categorical ids + dense features) as RecordIO",
                        formatter_class=HelpFormatter)
    d.add_argument("--out", required=True, metavar="DIR", help="writes DIR/train and DIR/validation")
    d.add_argument("--rows", type=int, default=20000, metavar="N", help="records to generate (at least 2)")
    d.add_argument("--validation-fraction", type=float, default=0.2, metavar="F",
                   help="share of the records held out for validation, between 0 and 1")
    d.add_argument("--seed", type=int, default=0, metavar="N", help="seeds the generator")
    d.set_defaults(fn=cmd_data_ctr)
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
    w.set_defaults(fn=cmd_worker)
    return parser


def main(argv: list[str] | None = None) -> int:
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


if __name__ == "__main__":
    sys.exit(main())
