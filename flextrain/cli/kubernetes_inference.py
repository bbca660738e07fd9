"""``flextrain evaluate|predict --backend kubernetes``: an ElasticJob of ``spec.jobType`` evaluation or prediction.

The flags are those of the local commands (flextrain.cli.evaluate) plus the
Kubernetes ones of ``train --backend kubernetes`` (flextrain.cli.kubernetes),
and the ElasticJob is submitted the same way. Every path (``--model-def``,
``--checkpoint``, the data, ``--output``, ``--job-dir``) is a path inside the
pods and is passed through unresolved: the master pod finds the checkpoint
file of a job directory and checks module, data and checkpoint before any
worker pod starts (flextrain.cli.cluster).
"""

from __future__ import annotations

from flextrain.cli.common import CLIError
from flextrain.cli.kubernetes import _train_dispatch, add_train_flags, cluster_settings, elasticjob_of, submit


def add_commands(sub) -> None:
    """The Kubernetes flags of ``train`` on ``evaluate`` and ``predict`` (added after those subcommands)."""
    for name in ("evaluate", "predict"):
        p = sub.choices[name]
        add_train_flags(p)
        p.set_defaults(fn=_train_dispatch(p.get_default("fn"), lambda args: submit(args, elasticjob_for_inference(args))))


def elasticjob_for_inference(args) -> dict:
    """The ElasticJob ``flextrain evaluate/predict --backend kubernetes`` submits."""
    from flextrain.cli.evaluate import _spec
    from flextrain.job import JobSpecError, JobType

    if args.overwrite:
        raise CLIError("--overwrite is for local jobs; a new ElasticJob's master moves an earlier job's state "
                       "in its job directory aside by itself")
    if args.command == "evaluate":
        job_type, data = JobType.EVALUATION, {"validation_data": args.validation_data}
    else:
        job_type, data = JobType.PREDICTION, {"prediction_data": args.prediction_data, "output": args.output}
    try:
        spec = _spec(args, job_type, in_pod=True, **data, **cluster_settings(args)).validate()
    except JobSpecError as exc:
        raise CLIError(str(exc)) from exc
    return elasticjob_of(spec, args)


__all__ = ["add_commands", "elasticjob_for_inference"]
