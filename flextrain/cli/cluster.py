"""The commands that run inside the cluster: ``flextrain operator`` and ``flextrain master``.

* ``flextrain operator [--namespace NS ... | --all-namespaces]`` runs the operator
  (what the chart's Deployment runs).
* ``flextrain master --job NAME --namespace NS`` is what the master pod runs:
  the master of one ElasticJob, resuming from its job directory when relaunched.

What acts on ElasticJobs from outside the cluster (``train --backend
kubernetes``, status, scale, stop) is in flextrain.cli.kubernetes.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path

from flextrain.cli.common import CLIError, api_client, get_job

log = logging.getLogger(__name__)


def add_commands(sub) -> None:
    """The ``operator`` and ``master`` subcommands."""
    p = sub.add_parser("operator", help="run the ElasticJob operator (what the chart's Deployment runs)")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--namespace", action="append", default=[], metavar="NS",
                       help="watch ElasticJobs in NS (repeatable; default: the operator's own namespace)")
    scope.add_argument("--all-namespaces", action="store_true", help="watch ElasticJobs in every namespace")
    p.add_argument("--sweep-interval", type=float, default=15.0, metavar="SECONDS",
                   help="time between level-triggered checks of every job's master (default: 15.0)")
    p.add_argument("--metrics-port", type=int, default=8080, metavar="PORT",
                   help="serve the operator's Prometheus metrics on PORT (default 8080; 0: a free port)")
    p.add_argument("--no-metrics", action="store_true", help="serve no Prometheus metrics")
    p.add_argument("--default-gang", choices=("volcano", "kueue"),
                   help="spec.scheduling.gang of jobs that set no spec.scheduling (the chart's scheduling.gang)")
    p.add_argument("--default-queue", metavar="NAME", help="spec.scheduling.queue of those jobs")
    p.add_argument("--network-policies", action="store_true",
                   help="give every job NetworkPolicies that admit only its own pods (and this operator, from its "
                        "namespace) to its master and parameter-server ports (the chart's networkPolicies.enabled)")
    p.set_defaults(fn=cmd_operator)
    p = sub.add_parser("master", help="(internal) run the master of an ElasticJob (what the master pod runs)")
    p.add_argument("--job", required=True, metavar="NAME", help="the ElasticJob")
    p.add_argument("--namespace", help="its namespace (default: this pod's)")
    p.add_argument("--host", default="0.0.0.0", help="address the master's servers bind")
    p.add_argument("--port", type=int, default=None, help="gRPC port (default: 50051)")
    p.set_defaults(fn=cmd_master)


def cmd_operator(args) -> int:
    from flextrain.job import JobSpec, JobSpecError, check_port, check_positive_finite
    from flextrain.k8s import meta
    from flextrain.operator.main import run_operator

    from flextrain.job.crossfield import check_scheduling
    from flextrain.job.settings import check_object_name

    default = {k: v for k, v in (("gang", args.default_gang), ("queue", args.default_queue)) if v}
    try:
        check_positive_finite("--sweep-interval", args.sweep_interval)
        check_port("--metrics-port", args.metrics_port)
        if args.default_queue:
            check_object_name("--default-queue", args.default_queue)
        check_scheduling(JobSpec.of(name="default", model_def="m", job_dir="/", **default))
    except JobSpecError as exc:
        raise CLIError(str(exc).replace("--gang", "--default-gang").replace("--queue", "--default-queue")) from exc
    api = api_client()
    namespaces = args.namespace or ([] if args.all_namespaces else [meta.current_namespace()])
    run_operator(api, namespaces=namespaces, clusterwide=args.all_namespaces, sweep_interval=args.sweep_interval,
                 metrics_port=None if args.no_metrics else args.metrics_port,
                 default_scheduling=default or None,
                 network_policies_from=meta.current_namespace() if args.network_policies else None)
    return 0


def _cannot_start(exc: BaseException) -> str:
    """Why the master pod cannot start, in the ElasticJob's words: the checks it shares with ``flextrain
    train`` name flags (``--model-def``), the user wrote spec fields (``spec.modelDef``)."""
    from flextrain.master.failures import in_spec_words

    return f"the master cannot start: {in_spec_words(str(exc))}"


def _finished_training(spec) -> str | None:
    """The final checkpoint of ``spec``'s job directory, if training finished there."""
    from flextrain.master.checkpoints import CheckpointStore

    latest = CheckpointStore(Path(spec.job_dir) / "checkpoints").latest()
    return latest["checkpoint"] if latest and latest.get("final") else None


def _preflight(spec) -> None:
    from flextrain.worker.preflight import PreflightError, run_preflight

    hint = "spec.training.preflight: false skips it"
    try:
        run_preflight(spec, skip_hint=hint)
    except PreflightError as exc:  # say how to skip it: the master pod may lack the workers' hardware
        if hint in str(exc):
            raise
        raise PreflightError(f"{exc} [checked by preflight in the master pod; {hint}]") from None


def _inference_spec(kube, job: dict, spec):
    """An evaluation or prediction job's spec with its checkpoint file (``spec.checkpoint`` may name a
    training job's directory), once the module, data and checkpoint passed the checks ``flextrain
    evaluate/predict`` makes; a failed check fails the job naming it (no relaunch can fix it).

    Its master does not resume: evaluating or predicting again from the start gives the same result
    (prediction parts are replaced whole, flextrain/worker/prediction.py)."""
    from flextrain.cli.evaluate import check_inference_job, resolve_checkpoint
    from flextrain.cli.ps_model import ps_model_checkpoint
    from flextrain.data import DataError
    from flextrain.job import JobSpecError
    from flextrain.job.usermodule import ModelDefError

    try:
        spec = spec.replace(checkpoint=resolve_checkpoint(spec.checkpoint, field="spec.checkpoint"))
        with ps_model_checkpoint(spec, field="spec.checkpoint") as spec:  # a ParameterServer job's model
            for warning in check_inference_job(spec, field="spec.checkpoint"):
                log.warning("%s", warning)
    except (DataError, JobSpecError, ModelDefError) as exc:
        message = _cannot_start(exc)
        _conclude(kube, job, "Failed", message, failure=_failure_of(exc, stage="checking the job"))
        raise CLIError(message) from None
    return spec


def _failure_of(exc: BaseException, *, stage: str) -> dict:
    """``status.failure`` for the job's own input that the master pod refused: its module (UserCode: the
    import, a missing file or name, a broken contract found by preflight), its data or its spec."""
    from flextrain.data import DataError
    from flextrain.job import JobSpecError

    kind = "Data" if isinstance(exc, DataError) else "InvalidSpec" if isinstance(exc, JobSpecError) else "UserCode"
    from flextrain.master.failures import in_spec_words

    return {"worker": "master", "kind": kind, "exception": type(exc).__name__, "message": in_spec_words(str(exc)),
            "stage": stage}


def _conclude(kube, job: dict, phase: str, message: str, *, failure: dict | None = None) -> None:
    """Write the status that ends the job (flextrain.k8s.job_status: the same conditions as a master that
    ran it writes); if the API server refuses it, a Warning Event and a CLIError say so (the pod then fails,
    and the operator's relaunch tries again)."""
    from flextrain.k8s.job_status import ended_status, observed_generation
    from flextrain.k8s.refusals import Refused

    md = job["metadata"]
    try:  # its conditions and startTime as they are now, not as this master read them at its start
        current = kube.get_job(md["namespace"], md["name"]) or job
    except Exception:  # noqa: BLE001 - unreadable: the reading at the start will do; the patch reports a refusal
        current = job
    status = {**ended_status(current, phase=phase, message=message, failure=failure),
              **observed_generation(job)}  # the spec this master read and acted on
    try:
        kube.patch_status(job, status)
    except Refused as exc:
        message = f"the job ended ({phase}: {message}), but {exc}"
        kube.event(job, reason="StatusRefused", message=message, warning=True)
        raise CLIError(message) from None


def cmd_master(args) -> int:
    """Run the master of an ElasticJob; a relaunched master resumes from the job's latest checkpoint.

    SIGTERM (the pod deleted, preempted or drained) ends the process at once
    without concluding the job: the operator relaunches the master, and the new
    one resumes from the checkpoint and ledger in the job directory. Only a
    master that finishes the job writes its final phase -- or one that cannot
    start because of the job's input (data, spec, resume state), which fails
    the job naming the problem instead of being relaunched in vain.
    """
    from flextrain.data import DataError
    from flextrain.job import JobSpecError, JobType
    from flextrain.job.usermodule import ModelDefError  # the master imports a module for its custom_data_reader
    from flextrain.k8s import meta
    from flextrain.k8s.resource import ResourceError, jobspec_from_resource
    from flextrain.master.main import ResumeError, run_master

    if args.port is not None and not 0 <= args.port < 65536:  # 0: any free port (tests use it)
        raise CLIError(f"--port must be a port number (0-65535), got {args.port}")
    namespace = args.namespace or meta.current_namespace()
    api = api_client()
    from flextrain.operator.kube import Kube

    kube = Kube(api)
    job = get_job(kube, namespace, args.job)
    try:
        spec = jobspec_from_resource(job)
    except ResourceError as exc:
        raise CLIError(f"ElasticJob {namespace}/{args.job}: {exc}") from exc
    stop_reason = (job["metadata"].get("annotations") or {}).get(meta.ANNOTATION_STOP)
    if stop_reason:  # stopped while no master ran (or before this relaunch): do not train
        message = f"stopped: {stop_reason} (requested before this master started)"
        _conclude(kube, job, "Failed", message)
        print(message)
        return 1
    port = args.port if args.port is not None else meta.MASTER_PORT
    relaunches = int((job.get("status") or {}).get("masterRelaunches") or 0)
    # A relaunch (told by the operator's count) resumes; a first master starts afresh even if
    # an older job of the same name left a directory behind.
    resume = relaunches > 0 and (Path(spec.job_dir) / "jobspec.json").is_file()
    if spec.job_type is not JobType.TRAINING:  # evaluation / prediction: checked, then (re)run from the start
        spec, resume = _inference_spec(kube, job, spec), False
    if resume and (done := _finished_training(spec)) is not None:
        # The previous master was lost after the final checkpoint, before it concluded the job.
        message = (f"training finished (final checkpoint {done}) before master pod {relaunches - 1} was lost; "
                   "concluded by its relaunch, without the final evaluation")
        _conclude(kube, job, "Succeeded", message)
        print(message)
        return 0
    # The module's contract, before a single worker pod exists (a script job has no module contract).
    if spec.training.preflight and not resume and not spec.is_script and spec.job_type is JobType.TRAINING:
        try:
            _preflight(spec)
        except (DataError, JobSpecError, ModelDefError) as exc:  # the job's input: relaunching cannot help
            message = _cannot_start(exc)
            _conclude(kube, job, "Failed", message, failure=_failure_of(exc, stage="preflight"))
            raise CLIError(message) from None
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["code"] = run_master(spec, host=args.host, port=port, resume=resume, namespace=namespace,
                                         api_client=api)
        except ResumeError as exc:
            outcome["error"] = f"the relaunched master cannot resume: {exc}"
        except (DataError, JobSpecError, ModelDefError) as exc:  # the job's input: no relaunch can fix it
            outcome["error"] = _cannot_start(exc)
            outcome["failure"] = _failure_of(exc, stage="starting")
        except BaseException as exc:  # reported below; the pod fails and the operator relaunches
            log.exception("master of %s/%s crashed", namespace, args.job)
            outcome["crash"] = exc

    def on_signal(signum, frame) -> None:
        log.warning("signal %d: leaving without concluding the job (the operator relaunches the master)", signum)
        sys.stderr.flush()
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    thread = threading.Thread(target=run, name="master", daemon=True)  # the main thread keeps the signals
    thread.start()
    while thread.is_alive():
        thread.join(1.0)  # short waits: the main thread stays responsive to signals
    if "error" in outcome:
        message = outcome["error"]
        _conclude(kube, job, "Failed", message, failure=outcome.get("failure"))
        raise CLIError(message)
    if "crash" in outcome:
        return 1
    return outcome["code"]


__all__ = [
    "add_commands",
    "cmd_master",
    "cmd_operator",
]
