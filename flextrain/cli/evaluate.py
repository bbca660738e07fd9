"""``flextrain evaluate`` and ``flextrain predict``: evaluation-only and prediction jobs.

Both run the model of a flextrain checkpoint (``--checkpoint FILE`` or a
training job's directory) on data sharded into tasks through the master's
ledger, with ``--workers`` worker processes; this process is the master and
exits 0 only when the job succeeded. Everything checkable (module, data,
checkpoint against the model, output directory) is checked before any
process starts.
"""

from __future__ import annotations

import sys
from pathlib import Path

from flextrain.cli.common import (DEFAULT_JOBS_DIR, CLIError, HelpFormatter, abs_path, add_data_flags, data_abs,
                                  job_name, model_def_abs)
from flextrain.cli.ps_model import is_ps_job_dir, ps_model_checkpoint


def _add_common(p) -> None:
    p.add_argument("--model-def", metavar="MODULE:NAME", required=True,
                   help="model-zoo module and model callable: path/to/module.py:Name or package.module.Name")
    p.add_argument("--checkpoint", metavar="PATH_OR_JOB_DIR", required=True,
                   help="a flextrain checkpoint file, or a training job's directory (its final checkpoint, "
                        "else its latest; a ParameterServer job's model is read from its ps-checkpoints/)")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="worker processes")
    p.add_argument("--global-batch-size", type=int, default=64, metavar="N",
                   help="with --steps-per-task: records per task = steps-per-task x global-batch-size")
    p.add_argument("--steps-per-task", type=int, default=8, metavar="N",
                   help="batches of --global-batch-size records per task (the unit handed out and re-queued)")
    p.add_argument("--max-micro-batch", type=int, metavar="N", help="records one worker runs through the model "
                                                                    "at once (default: --global-batch-size)")
    p.add_argument("--job-name", metavar="NAME",
                   help="job name (default: the module's name + '-evaluate' / '-predict')")
    p.add_argument("--job-dir", metavar="DIR", help=f"logs and status.json (default: ./{DEFAULT_JOBS_DIR}/NAME)")
    p.add_argument("--overwrite", action="store_true",
                   help="reuse a --job-dir that holds an earlier job (refused otherwise): its state is moved "
                        "aside to JOBDIR/previous-<time>/, not deleted")
    p.add_argument("--max-task-retries", type=int, default=3, metavar="N",
                   help="a failing task is retried this often, then the job fails")
    p.add_argument("--worker-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="silence after which a worker counts as hung")
    p.add_argument("--relaunch-budget", type=int, default=3, metavar="N", help="relaunches per worker slot")
    p.add_argument("--no-progress", action="store_true", help="no live progress display")
    add_data_flags(p)


def add_commands(sub) -> None:
    p = sub.add_parser(
        "evaluate", help="evaluate a checkpoint's model on validation data (an evaluation-only job)",
        description="Evaluate the model of a flextrain checkpoint with the module's eval_metrics_fn on "
                    "--validation-data, sharded over --workers. Metrics are the mean over every "
                    "validation record; they are printed and written to the job's status.json.",
        formatter_class=HelpFormatter,
    )
    _add_common(p)
    p.add_argument("--validation-data", metavar="DIR", required=True,
                   help="RecordIO/CSV records to evaluate on: a directory, a file, a glob or a comma-separated list")
    p.set_defaults(fn=cmd_evaluate)
    p = sub.add_parser(
        "predict", help="run a checkpoint's model over data and write predictions (a prediction job)",
        description="Run the model of a flextrain checkpoint in PREDICTION mode over --prediction-data, "
                    "sharded over --workers, and write one JSON line per input record to --output "
                    "(part-<task>.jsonl files in input order plus manifest.json).",
        formatter_class=HelpFormatter,
    )
    _add_common(p)
    p.add_argument("--prediction-data", metavar="DIR", required=True,
                   help="RecordIO/CSV records to predict on: a directory, a file, a glob or a comma-separated list")
    p.add_argument("--output", metavar="DIR", required=True, help="directory for the predictions (empty or new)")
    p.set_defaults(fn=cmd_predict)


def resolve_checkpoint(value: str, *, field: str = "--checkpoint") -> str:
    """A checkpoint file from ``--checkpoint`` (``spec.checkpoint`` in a pod, named by ``field``): the file
    itself, or a job directory's final/latest one. Raises JobSpecError naming ``field``."""
    from flextrain.job import JobSpecError

    path = Path(value)
    if path.is_file():
        return str(path.resolve())
    if not path.is_dir():
        raise JobSpecError(f"{field} {value}: no such file or directory")
    for directory in (path / "checkpoints", path):
        if (directory / "final.ckpt").is_file():
            return str((directory / "final.ckpt").resolve())
        if (directory / "latest.json").is_file():
            from flextrain.master.checkpoints import CheckpointStore

            newest, damaged = CheckpointStore(directory).newest_model()  # in this directory, checksum checked
            if newest is None:
                raise JobSpecError(f"{field} {value}: no usable checkpoint in {directory}: {'; '.join(damaged)}")
            if damaged:
                print(f"flextrain: warning: damaged checkpoints skipped: {'; '.join(damaged)}", file=sys.stderr)
            return str(newest.resolve())
    if is_ps_job_dir(value):  # its model is on its parameter servers: exported once the module is known
        return str(path.resolve())
    raise JobSpecError(f"{field} {value}: a directory without a checkpoint "
                       f"(no checkpoints/final.ckpt or checkpoints/latest.json)")


def _spec(args, job_type, *, in_pod: bool = False, **fields):
    """The job's JobSpec from the flags; ``in_pod``: paths are inside the pods of an ElasticJob, taken as given
    (the checkpoint is found in the master pod), else resolved here."""
    from flextrain.job import Backend, JobSpec, JobSpecError, JobType
    from flextrain.k8s.resource import DEFAULT_JOBS_ROOT

    name = job_name(args)
    if not args.job_name and not args.job_dir:  # not the training job's own name and directory
        name = f"{name[:44]}-{'evaluate' if job_type is JobType.EVALUATION else 'predict'}"
    try:
        checkpoint = args.checkpoint if in_pod else resolve_checkpoint(args.checkpoint)
    except JobSpecError as exc:
        raise CLIError(str(exc)) from None
    where = ({"model_def": args.model_def, "job_dir": args.job_dir or f"{DEFAULT_JOBS_ROOT}/{name}",
              "backend": Backend.KUBERNETES} if in_pod else
             {"model_def": model_def_abs(args.model_def), "job_dir": abs_path(args.job_dir or str(DEFAULT_JOBS_DIR / name))})
    return JobSpec.of(
        name=name, training_data=None, job_type=job_type, checkpoint=checkpoint, **where,
        workers=args.workers, global_batch_size=args.global_batch_size, steps_per_task=args.steps_per_task,
        max_micro_batch=args.max_micro_batch, max_task_retries=args.max_task_retries,
        worker_timeout=args.worker_timeout, relaunch_budget=args.relaunch_budget,
        skip_unknown_files=args.skip_unknown_files, csv_header=args.csv_header, data_secret=args.data_secret,
        record_cache_mb=args.record_cache_mb, **fields,
    )


def _check_checkpoint_file(path: str, *, field: str) -> None:
    """JobSpecError unless ``path`` begins as a flextrain checkpoint does (read: 4 bytes); the job would only
    find it out in its workers, as a model that 'does not fit'."""
    from flextrain.elastic.statecodec import MAGIC
    from flextrain.job import JobSpecError

    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
    except OSError as exc:
        raise JobSpecError(f"{field} {path}: cannot be read ({exc.strerror})") from None
    if head != MAGIC:
        raise JobSpecError(f"{field} {path}: not a flextrain checkpoint (its first bytes are {head!r}, a "
                           f"checkpoint's {MAGIC!r}); give a checkpoint file (checkpoints/*.ckpt) or a job "
                           "directory (its final or latest checkpoint)")


def check_inference_job(spec, *, field: str = "--checkpoint") -> list[str]:
    """Everything checkable of an evaluation or prediction job before a worker starts: the spec, the
    module (eval_metrics_fn / PredictionOutputsProcessor), the data, the checkpoint against the model and
    (prediction) its weights being finite. Raises JobSpecError, ModelDefError or DataError; returns warnings
    (data files skipped). ``field`` names the checkpoint setting in messages (``spec.checkpoint`` in a pod).
    Run by ``flextrain evaluate/predict`` and by the master pod of such an ElasticJob."""
    from flextrain.data import DataOptions, plan_shards
    from flextrain.job import JobType
    from flextrain.worker.frameworks import make_predictor
    from flextrain.worker.module import ModelDefError, load_model_def
    from flextrain.worker.prediction import load_outputs_processor

    spec.validate()
    _check_checkpoint_file(spec.checkpoint, field=field)
    model_def = load_model_def(spec.model_def)
    if spec.job_type is JobType.EVALUATION and model_def.eval_metrics_fn is None:
        raise ModelDefError(f"{model_def.path} defines no `eval_metrics_fn` (required by an evaluation job, "
                            "flextrain evaluate or spec.jobType evaluation: "
                            "eval_metrics_fn() -> {name: fn(labels, predictions)})")
    if spec.job_type is JobType.EVALUATION:
        model_def.metric_fns()
        data, what = spec.data.validation, "validation data"
    else:
        load_outputs_processor(model_def)
        data, what = spec.data.prediction, "prediction data"
    skipped: list[str] = []
    # the module's `columns` (checked by load_model_def) against every Parquet file, not only the first read below
    options = DataOptions.of(spec.data, columns=model_def.columns)
    shards = plan_shards(data, what=what, options=options, skipped=skipped,
                         reader=model_def.custom_data_reader,
                         records_per_task=spec.training.global_batch_size * spec.training.steps_per_task)
    model = model_def.build_model()
    make_predictor(model_def, model).load_checkpoint(spec.checkpoint)
    if spec.job_type is JobType.EVALUATION and shards:  # the first records through feed, model and metrics
        from flextrain.worker.preflight import check_evaluation

        check_evaluation(model_def, model, shards[0], batch=min(spec.training.global_batch_size, 64),
                         data_origin=spec.data.validation)
    if spec.job_type is JobType.PREDICTION:
        refuse_nonfinite(spec.checkpoint, field=field)
        if shards:  # the first records through feed and the model, into rows
            from flextrain.worker.preflight import check_prediction

            check_prediction(model_def, model, shards[0], batch=min(spec.training.global_batch_size, 64),
                             data_origin=spec.data.prediction)
    return skipped


def _check_and_run(spec, args) -> int:
    from flextrain.data import DataError
    from flextrain.job import JobSpecError
    from flextrain.master.jobdir import JobDirError, guard
    from flextrain.master.main import run_master
    from flextrain.worker.module import ModelDefError

    try:
        spec.validate()
        guard(spec.job_dir, overwrite=args.overwrite, resumable=False)  # before anything is written
        with ps_model_checkpoint(spec) as spec:  # a ParameterServer job's model: exported first
            for warning in check_inference_job(spec):
                print(f"flextrain: warning: {warning}", file=sys.stderr)
    except (JobSpecError, ModelDefError, DataError, JobDirError) as exc:
        raise CLIError(str(exc)) from exc
    show = sys.stderr.isatty() and not args.no_progress
    try:
        return run_master(spec, show_progress=show)
    except JobDirError as exc:  # another master took the lock meanwhile
        raise CLIError(str(exc)) from exc


def refuse_nonfinite(checkpoint: str, *, field: str = "--checkpoint") -> None:
    """Predictions of a model with NaN or infinite weights are NaN: refuse it, naming the weights."""
    from flextrain.elastic.statecodec import decode, nonfinite
    from flextrain.job import JobSpecError

    with open(checkpoint, "rb") as f:
        bad = nonfinite(decode(f.read()).get("model", {}))
    if bad:
        raise JobSpecError(f"{field} {checkpoint}: the model has non-finite weights ({'; '.join(bad)}), so every "
                           "prediction would be NaN; use an earlier checkpoint of the job (checkpoints/ckpt-*.ckpt)")


def cmd_evaluate(args) -> int:
    from flextrain.job import JobType

    spec = _spec(args, JobType.EVALUATION, validation_data=data_abs(args.validation_data))
    return _check_and_run(spec, args)


def cmd_predict(args) -> int:
    from flextrain.data.predictions import MANIFEST
    from flextrain.job import JobType

    from flextrain.data.sql import is_sql_url

    if is_sql_url(args.output):  # a table: created here if missing, refused if it holds rows
        from flextrain.data import DataError
        from flextrain.data.sql_output import prepare_output_table

        url = data_abs(args.output)
        try:
            prepare_output_table(url)
        except DataError as exc:
            raise CLIError(str(exc)) from None
        spec = _spec(args, JobType.PREDICTION, prediction_data=data_abs(args.prediction_data), output=url)
        return _check_and_run(spec, args)
    output = Path(args.output)
    if output.exists() and not output.is_dir():
        raise CLIError(f"--output {args.output} exists and is not a directory")
    if output.is_dir() and ((output / MANIFEST).exists() or any(output.glob("part-*.jsonl"))):
        raise CLIError(f"--output {args.output} already holds predictions ({MANIFEST} or part-*.jsonl); "
                       "choose an empty or new directory")
    spec = _spec(args, JobType.PREDICTION, prediction_data=data_abs(args.prediction_data), output=abs_path(args.output))
    return _check_and_run(spec, args)
