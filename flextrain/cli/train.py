"""``flextrain train``: its flags, the job spec they make, ``--resume`` and the local run.

With the local backend this process becomes the job's master (cmd_train);
``--backend kubernetes`` is dispatched by flextrain.cli.kubernetes, which
builds its ElasticJob from the same :func:`build_spec`.
"""

from __future__ import annotations

import argparse
import sys

from flextrain.cli.common import (DEFAULT_JOBS_DIR, CLIError, HelpFormatter, abs_path, add_data_flags,
                                  add_metrics_flags, data_abs, job_name, model_def_abs)
from flextrain.cli.submission import check_module, import_meanwhile, preload_by_source, preload_framework


def add_commands(sub) -> None:
    """The ``train`` subcommand (running cmd_train)."""
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
                   help="RecordIO, CSV or Parquet training data (told by content): a directory, a file, a glob "
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
    g.add_argument("--ps-wal-fsync", action="store_true",
                   help="each PS also flushes its log to the device before answering pushes (one fdatasync per "
                        "group of pushes): acknowledged updates survive the loss of the machine, not only of the PS")
    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=int, default=1, metavar="N", help="passes over the training data")
    g.add_argument("--global-batch-size", type=int, default=64, metavar="N",
                   help="samples per optimizer step, kept fixed as workers come and go")
    g.add_argument("--max-micro-batch", type=int_or_text, metavar="N|auto",
                   help="largest batch one worker computes at once; more samples are accumulated "
                        "(default: --global-batch-size). auto: each worker measures the largest whose training "
                        "step stays under --memory-limit, and every round plans with its members' smallest "
                        "(AllReduce, PyTorch modules; docs/running-jobs.md)")
    g.add_argument("--memory-limit", type=int_or_text, metavar="BYTES",
                   help="--max-micro-batch auto: the memory a worker's training step may peak at, in bytes or "
                        "e.g. 2GiB, 512MB (default: 80%% of what the worker may use: its container's limit, "
                        "else the machine's available memory)")
    g.add_argument("--lr", "--learning-rate", dest="learning_rate", type=float, metavar="LR",
                   help="learning rate passed to the module's optimizer (default: the module's own)")
    g.add_argument("--accelerate", metavar="auto|FILE|METHODS",
                   help="a training strategy the workers apply to the module's model (PyTorch, AllReduce): 'auto' "
                        "(the first worker searches once by dry runs; the job keeps its choice in "
                        "JOBDIR/accelerate/strategy.json and every worker, relaunched, joining or resumed, applies "
                        "it), a JSON strategy FILE, or methods such as amp_native:bf16,checkpoint:Block "
                        "(docs/accelerate.md, 'In jobs')")
    g.add_argument("--batch-schedule", metavar="TRACE.csv|adaptive",
                   help="the global batch of every optimizer step from a CSV 'step,batchsize' (steps counted "
                        "from 0 across epochs; the last size holds past its end), or 'adaptive': chosen from the "
                        "gradient noise scale within --min/--max-global-batch; --global-batch-size then only "
                        "defaults --reference-batch-size and --max-micro-batch (docs/batch-schedules.md)")
    g.add_argument("--lr-rule", choices=("none", "linear", "sqrt", "adascale"), default="none",
                   help="how the learning rate follows the global batch G: linear lr*G/ref, sqrt lr*sqrt(G/ref), "
                        "adascale lr*gain (AdaScale's gain, measured from the micro-batches' gradients)")
    g.add_argument("--reference-batch-size", type=int, metavar="N",
                   help="the global batch the base learning rate was tuned for (default: --global-batch-size; "
                        "--min-global-batch under --batch-schedule adaptive)")
    g.add_argument("--min-global-batch", type=int, metavar="A",
                   help="--batch-schedule adaptive: the smallest G (the first; AdaScale's reference)")
    g.add_argument("--max-global-batch", type=int, metavar="B", help="--batch-schedule adaptive: the largest G")
    g.add_argument("--adapt-every", type=int, metavar="N",
                   help="--batch-schedule adaptive: choose G every N optimizer steps (default: at each epoch)")
    g.add_argument("--bucket-mb", type=float, default=25.0, metavar="MIB",
                   help="AllReduce (PyTorch): sum gradients in buckets of about this many MiB while backward runs "
                        "(default 25, as DDP's bucket_cap_mb); 0: one reduction after backward")
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
    g.add_argument("--memory-checkpoint-steps", type=int, default=0, metavar="N",
                   help="copy model and optimizer state to shared memory every N optimizer steps, persisted "
                        "in the background and flushed when the workers are lost (AllReduce; 0, the default: off; "
                        "e.g. 50)")
    g.add_argument("--memory-checkpoint-persist-every", type=int, default=4, metavar="P",
                   help="also write every P-th in-memory checkpoint to the job directory, in the background "
                        "(the others stay in shared memory until a worker exits or the workers are lost; "
                        "default 4; 1: every one)")
    g.add_argument("--memory-checkpoint-persist-seconds", type=float, default=30.0, metavar="S",
                   help="write an in-memory checkpoint to the job directory only when at least S seconds have "
                        "passed since the last one written, as well as P snapshots (default 30; 0: by count alone; "
                        "where the host's shared memory is lost, up to S seconds of steps are redone)")
    g.add_argument("--rendezvous-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="how long a round waits for stragglers once --min-workers are present")
    g.add_argument("--worker-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="silence after which a worker counts as hung")
    g.add_argument("--start-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="how long a started worker may take to be ready (import the module, build the model "
                        "and optimizer) before it counts as hung")
    g.add_argument("--relaunch-budget", type=int, default=3, metavar="N",
                   help="relaunches per worker slot before giving up relaunching")
    g.add_argument("--worker-memory-limit", type=int_or_text, metavar="BYTES",
                   help="resident memory a local worker may use, in bytes or e.g. 2GiB: one over it is killed "
                        "(OOMKilled) and the job goes on with half the micro-batch (docs/shared-cluster.md; on "
                        "Kubernetes: the pod's resources.limits.memory)")
    g.add_argument("--spare-workers", dest="spares", type=int, default=0, metavar="K",
                   help="keep K spare workers started ahead (model and optimizer built) and parked: a scale-up or "
                        "the replacement of a lost worker takes one and joins in well under a second (AllReduce; "
                        "each spare costs a worker's memory: docs/spares.md)")
    g.add_argument("--straggler-policy", choices=("off", "report", "replace"), default="report",
                   help="a worker whose compute time per sample stays above --straggler-factor times the others' "
                        "median: report it (status, log; on Kubernetes an Event), replace it (on another node for "
                        "a while; ParameterServer: its tasks shrink instead) or off (default: report)")
    g.add_argument("--straggler-factor", type=float, default=2.0, metavar="X",
                   help="how many times slower than the other workers' median makes a straggler (default 2)")
    g.add_argument("--node-check", action="store_true",
                   help="time each new worker's training step before it joins; one --straggler-factor times "
                        "slower than the others is kept out of the job, naming its node (PyTorch modules)")
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
    add_metrics_flags(g)
    g.add_argument("--no-preflight", action="store_true",
                   help="skip preflight: before anything starts, a child process imports the module and checks "
                        "its contract on the first records (model, optimizer, feed, loss, one training step); "
                        "skip it for a module that only works on the workers' hardware")
    g.add_argument("--no-tensorboard", action="store_true",
                   help="write no TensorBoard event files (by default the master writes loss, LR, global batch, "
                        "samples/s, workers and evaluations under JOBDIR/tensorboard/; docs/observability.md)")
    g.add_argument("--nan-policy", choices=("fail", "skip-step"), default="fail",
                   help="a NaN or infinite loss or gradient: fail the job naming the step and the last good "
                        "checkpoint, or skip that step (nothing of it is applied) and go on")
    g.add_argument("--preflight-timeout", type=float, metavar="SECONDS",
                   help="how long preflight may take (default: $FLEXTRAIN_PREFLIGHT_TIMEOUT, else 120)")
    p.set_defaults(fn=cmd_train)


def build_spec(args):
    """The JobSpec of a new ``train`` job from its flags (paths made absolute; not validated)."""
    from flextrain.job import JobSpec, Strategy

    name = job_name(args)
    job_dir = args.job_dir or str(DEFAULT_JOBS_DIR / name)
    return JobSpec.of(
        name=name, model_def=model_def_abs(args.model_def), training_data=data_abs(args.training_data),
        validation_data=data_abs(args.validation_data), job_dir=abs_path(job_dir),
        workers=1 if args.workers is None else args.workers,
        evaluation_steps=args.evaluation_steps,
        min_workers=args.min_workers, max_workers=args.max_workers, epochs=args.epochs,
        global_batch_size=args.global_batch_size, max_micro_batch=args.max_micro_batch,
        memory_limit=args.memory_limit, accelerate=args.accelerate,
        learning_rate=args.learning_rate, seed=args.seed, shuffle=args.shuffle,
        batch_schedule=schedule_abs(args.batch_schedule), lr_rule=args.lr_rule,
        reference_batch_size=args.reference_batch_size, min_global_batch=args.min_global_batch,
        max_global_batch=args.max_global_batch, adapt_every=args.adapt_every,
        steps_per_task=args.steps_per_task, max_task_retries=args.max_task_retries,
        checkpoint_steps=args.checkpoint_steps, memory_checkpoint_steps=args.memory_checkpoint_steps,
        memory_checkpoint_persist_every=args.memory_checkpoint_persist_every,
        memory_checkpoint_persist_seconds=args.memory_checkpoint_persist_seconds,
        bucket_mb=args.bucket_mb,
        rendezvous_timeout=args.rendezvous_timeout,
        worker_timeout=args.worker_timeout, start_timeout=args.start_timeout, relaunch_budget=args.relaunch_budget,
        worker_memory_limit=args.worker_memory_limit,
        spares=args.spares, min_workers_timeout=args.min_workers_timeout,
        straggler_policy=args.straggler_policy, straggler_factor=args.straggler_factor, node_check=args.node_check,
        strategy=Strategy(args.distribution_strategy), ps=args.ps, ps_mode=args.ps_mode,
        grads_to_wait=args.grads_to_wait, ps_checkpoint_steps=args.ps_checkpoint_steps,
        ps_wal=args.ps_wal, ps_wal_fsync=args.ps_wal_fsync, nan_policy=args.nan_policy, preflight=not getattr(args, "no_preflight", False),
        metrics=not args.no_metrics, metrics_port=args.metrics_port, tls=tls_of(args),
        tensorboard=not args.no_tensorboard,
        skip_unknown_files=args.skip_unknown_files, csv_header=args.csv_header, data_secret=args.data_secret,
        record_cache_mb=args.record_cache_mb,
    )


def tls_of(args) -> bool:
    """``--tls``/``--no-tls`` as given, else the backend's default (on for Kubernetes jobs)."""
    from flextrain.job import KUBERNETES_DEFAULTS

    if args.tls is not None:
        return args.tls
    return bool(KUBERNETES_DEFAULTS["tls"]) if getattr(args, "backend", "local") == "kubernetes" else False


def int_or_text(value: str) -> int | str:
    """A flag that takes a number or a word (``--max-micro-batch 32|auto``, ``--memory-limit 2GiB``):
    an integer when it reads as one, else the text, which the JobSpec's rules judge (naming the flag)."""
    try:
        return int(value)
    except ValueError:
        return value.strip()


def check_memory_flag(spec) -> None:
    """``--memory-limit`` and ``--worker-memory-limit`` read as flextrain.elastic.memory reads them (JobSpecError
    naming the flag)."""
    given = [(flag, v) for flag, v in (("--memory-limit", spec.training.memory_limit),
                                       ("--worker-memory-limit", spec.worker.memory_limit)) if v is not None]
    if not given:
        return
    from flextrain.elastic.sizes import parse_memory
    from flextrain.job import JobSpecError

    try:
        for flag, value in given:
            parse_memory(value, what=flag)
    except ValueError as exc:
        raise JobSpecError(str(exc)) from None


def accelerate_in_spec(spec):
    """``--accelerate`` read as the workers will read it (flextrain.accelerate.jobs: JobSpecError naming the
    flag, the method and why); a FILE is read here and its strategy travels in the job as JSON (the workers,
    pods included, may not see the file): the spec to run."""
    value = spec.training.accelerate
    if value is None:
        return spec
    from flextrain.accelerate import AccelerateError, Strategy  # imports torch
    from flextrain.accelerate.jobs import AUTO, check_for_jobs, check_setting, is_json
    from flextrain.job import JobSpecError

    text = value.strip()
    try:
        if text != AUTO and not is_json(text) and _names_a_file(text):
            what = f"--accelerate {text}"
            strategy = check_for_jobs(Strategy.load(text, argument=what), what=what)
            return spec.replace(accelerate=strategy.to_json(indent=None))
        check_setting(text, what="--accelerate")
    except AccelerateError as exc:
        raise JobSpecError(str(exc)) from None
    return spec


def _names_a_file(text: str) -> bool:
    """A value of ``--accelerate`` that is a path rather than a comma list of methods (which never has a
    slash, and whose names are no files here)."""
    from pathlib import Path

    return "/" in text or text.endswith(".json") or Path(text).is_file()


def schedule_abs(value: str | None) -> str | None:
    """A trace path made absolute (the master reads it, and again on --resume); inline text as is."""
    return value if value is None or value == "adaptive" or "\n" in value.strip() else abs_path(value)


# flags of `train` that are not JobSpec fields: how each reaches the spec on --resume
_DEST_FIELD = {"distribution_strategy": "strategy", "job_name": "name", "no_preflight": "preflight",
               "no_metrics": "metrics",
               "no_tensorboard": "tensorboard"}
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
        if dest in ("no_preflight", "no_metrics", "no_tensorboard"):
            value = not value
        elif dest == "distribution_strategy":
            value = Strategy(value)
        elif dest in ("validation_data", "training_data"):
            value = data_abs(value)
        elif dest == "model_def":  # as stored (an absolute file), so that the job's own value is told as such
            value = model_def_abs(value)
        elif dest in ("image", "namespace", "dry_run", "pvc", "master_port"):
            refused.append(f"--{dest.replace('_', '-')}")
            continue
        given[field] = value
    resumed = resumed_spec(args.resume, given, refused=tuple(refused))
    return resumed


def _warn_small_pieces(spec, shards) -> None:
    """A step never spans two files (or a Parquet file's row groups): a global batch larger than every one
    of them makes every step smaller than it. It trains, so a warning, not an error."""
    G = spec.training.global_batch_size
    largest = max(shards, key=lambda s: s.size, default=None)
    if spec.training.batch_schedule is None and largest is not None and largest.size < G:
        print(f"flextrain: warning: --global-batch-size {G} is larger than every piece of the training data (the "
              f"largest, {largest.source} records [{largest.start}, {largest.end}), holds {largest.size}); a step "
              f"never spans two, so every step trains fewer than {G} samples", file=sys.stderr)


def cmd_train(args) -> int:
    zygotes: list = []  # the one started for the job's local children: closed however this ends
    try:
        return _train(args, zygotes)
    finally:
        for zygote in zygotes:
            zygote.close()


def _train(args, zygotes: list) -> int:
    from flextrain.zygote import Zygote

    # This process becomes a local job's master: its children (preflight, workers, parameter servers) fork
    # from a zygote that imports torch from now on, while the job is checked (flextrain/zygote.py)
    zygote = Zygote.for_local_job()
    zygotes.extend([zygote] if zygote else [])
    from flextrain.data import DataError, DataOptions, plan_shards
    from flextrain.job import JobSpecError
    from flextrain.job.usermodule import module_columns
    from flextrain.master.batches import job_schedule
    from flextrain.master.jobdir import JobDirError, guard
    from flextrain.master.main import custom_reader_of, run_master
    from flextrain.worker.module import ModelDefError

    if args.resume and args.overwrite:  # before the stored job is even read
        raise CLIError("--resume and --overwrite contradict each other: continue the job or start afresh, not both")
    if not args.resume:
        missing = [f for f in ("model_def", "training_data") if not getattr(args, f)]
        if missing:
            raise CLIError(f"--{missing[0].replace('_', '-')} is required (unless --resume JOBDIR)")
    try:
        resumed = resume_spec(args) if args.resume else None
        spec = accelerate_in_spec((resumed.spec if resumed else build_spec(args)).validate())
        check_memory_flag(spec)
        guard(spec.job_dir, resume=bool(args.resume), overwrite=args.overwrite)  # before anything is written
        job_schedule(spec)  # a bad trace names its line before anything starts
        if resumed and resumed.moved_from:
            print(f"flextrain: {spec.job_dir} was recorded at {resumed.moved_from}: resuming from its own "
                  "state here", file=sys.stderr)
        if args.preflight_timeout is not None:
            from flextrain.job import check_positive_finite

            check_positive_finite("--preflight-timeout", args.preflight_timeout)
        # Everything checkable is checked before a single process starts; the cheap checks first.
        import_meanwhile("torch")  # this process needs it too (the module, the master): not after preflight
        preload_by_source(zygote, spec)  # TensorFlow, for preflight too, where the module's source imports it
        if spec.training.preflight:  # the contract on real records, in a child: the module is code we cannot trust
            from flextrain.worker.preflight import run_preflight

            preload_framework(zygote, run_preflight(spec, timeout=args.preflight_timeout, zygote=zygote))
        # The data's shards, checked here before anything starts. After preflight: a module's
        # custom_data_reader plans its own shards, so the module is imported (in this process only once
        # preflight has seen it import and return); a reader that fails is refused, named. The warnings
        # about files skipped (--skip-unknown-files) are the master's: job events, shown once, in status.
        # The module's `columns` against every Parquet file's footer: preflight's child checks them (it
        # imports the module); without it, this process (which then imports the module anyway) does.
        columns = None if spec.training.preflight or spec.is_script else module_columns(spec.model_def)
        opts = {"options": DataOptions.of(spec.data, columns=columns), "skipped": [], "reader": custom_reader_of(spec),
                "records_per_task": spec.training.global_batch_size * spec.training.steps_per_task}
        _warn_small_pieces(spec, plan_shards(spec.data.training, what="training data", **opts))
        if spec.data.validation:
            plan_shards(spec.data.validation, what="validation data", **opts)
        if not spec.training.preflight:  # the module is first seen here: at least its names and signatures
            preload_framework(zygote, check_module(spec))
    except (JobSpecError, ModelDefError, DataError, JobDirError) as exc:
        raise CLIError(str(exc)) from exc
    from flextrain.master.main import ResumeError

    show = sys.stderr.isatty() and not args.no_progress
    try:
        return run_master(spec, show_progress=show, resume=bool(args.resume), zygote=zygote,
                          changes=resumed.changes if resumed else (),
                          moved_from=resumed.moved_from if resumed else None)
    except (ResumeError, JobDirError) as exc:  # JobDirError: another master took the lock meanwhile
        raise CLIError(str(exc)) from exc

