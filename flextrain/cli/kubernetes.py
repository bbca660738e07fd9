"""The Kubernetes side of the ``flextrain`` command line, as seen from outside the cluster.

* ``flextrain train|evaluate|predict --backend kubernetes ... [--image IMG] [--namespace NS] [--dry-run]``
  submits an ElasticJob (``--dry-run`` prints its YAML and submits nothing); evaluate and predict
  submit one of ``spec.jobType`` evaluation / prediction (flextrain.cli.kubernetes_inference adds that).
* ``flextrain status|scale|stop|suspend|resume NAME --namespace NS`` (or ``--backend kubernetes``)
  act on an ElasticJob through the API server, never by dialling the master
  (which is not reachable from outside the cluster): status reads the
  ElasticJob's status, scale patches ``spec.replicaSpecs.worker.replicas``
  (what ``kubectl scale ej/NAME`` does through the scale subresource), stop
  sets the annotation ``flextrain.dev/stop``. The operator relays both to the
  master, which stops at a step boundary leaving a checkpoint.

Paths given to ``train --backend kubernetes`` (``--model-def``, data,
``--job-dir``) are paths inside the pods and are passed through unresolved.

What runs inside the cluster (``flextrain operator``, ``flextrain master``)
is in flextrain.cli.cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import metadata
from pathlib import Path

from flextrain.cli.common import CLIError, api_client, get_job
from flextrain.cli.train import accelerate_in_spec, build_spec, check_memory_flag
from flextrain.job import flag_of


def _default_image() -> str:
    try:
        return f"flextrain:{metadata.version('flextrain')}"
    except metadata.PackageNotFoundError:
        return "flextrain:latest"


# ---- parsers ------------------------------------------------------------------------
def add_train_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("kubernetes (with --backend kubernetes: submit an ElasticJob instead of running here)")
    g.add_argument("--backend", choices=("local", "kubernetes"), default="local",
                   help="local: this process is the master; kubernetes: submit an ElasticJob to the cluster")
    g.add_argument("--image", default=_default_image(), help="container image of the job's pods")
    g.add_argument("--namespace", help="namespace of the ElasticJob (default: the kubeconfig context's)")
    g.add_argument("--dry-run", action="store_true", help="print the ElasticJob YAML, submit nothing")
    g.add_argument("--pvc", action="append", default=[], metavar="CLAIM:/MOUNT/PATH",
                   help="mount a PersistentVolumeClaim into every pod of the job (repeatable)")
    g.add_argument("--master-port", type=int, metavar="PORT", help="port of the job's master (default: 50051)")
    g = p.add_argument_group("shared cluster (with --backend kubernetes; docs/shared-cluster.md)")
    g.add_argument("--priority-class-name", metavar="CLASS",
                   help="PriorityClass of the first --min-workers worker pods (of every worker without "
                        "--elastic-priority-class-name)")
    g.add_argument("--elastic-priority-class-name", metavar="CLASS",
                   help="PriorityClass of the worker pods beyond --min-workers: the scheduler may preempt them; "
                        "a preempted worker shrinks the job without spending --relaunch-budget")
    g.add_argument("--gang", choices=("volcano", "kueue"),
                   help="admit master, parameter servers and --min-workers workers together: a Volcano PodGroup, "
                        "or a Kueue queue (the job is submitted suspended until Kueue admits it)")
    g.add_argument("--queue", metavar="NAME", help="--gang: the Volcano Queue or Kueue LocalQueue")
    g.add_argument("--suspend", action="store_true", default=None,
                   help="submit the job suspended: no pod starts until spec.suspend is set to false")
    g.add_argument("--ttl-seconds-after-finished", type=int, metavar="SECONDS",
                   help="delete the job's pods and Services this long after it finished (the ElasticJob stays)")
    g.add_argument("--active-deadline-seconds", type=int, metavar="SECONDS",
                   help="fail the job (reason DeadlineExceeded) this long after it started")
    g.add_argument("--backoff-limit", type=int, metavar="N",
                   help="times the operator relaunches a failed master pod (default 3)")


# Settings only an ElasticJob carries (flags above): refused for a local job rather than ignored.
CLUSTER_SETTINGS = ("priority_class_name", "elastic_priority_class_name", "gang", "queue", "suspend",
                    "ttl_seconds_after_finished", "active_deadline_seconds", "backoff_limit")


def add_job_flags(p: argparse.ArgumentParser) -> None:
    """Flags of status/stop/scale that select a Kubernetes job instead of a local one."""
    p.add_argument("--namespace", help="the job is an ElasticJob in this namespace")
    p.add_argument("--backend", choices=("local", "kubernetes"),
                   help="kubernetes: the job is an ElasticJob (in --namespace, default the kubeconfig context's)")


def wants_kubernetes(args) -> bool:
    return getattr(args, "backend", None) == "kubernetes" or bool(getattr(args, "namespace", None))


def dispatch(local_fn, kubernetes_fn):
    """A command function that acts on an ElasticJob when the flags say so, else on a local job."""
    def run(args) -> int:
        return (kubernetes_fn if wants_kubernetes(args) else local_fn)(args)

    return run


def _train_dispatch(local_fn, submit_fn=None):
    """``local_fn``, or with ``--backend kubernetes`` ``submit_fn`` (default: submit the train command's
    ElasticJob); Kubernetes flags without it are refused."""
    def run(args) -> int:
        if args.backend == "kubernetes":
            return (submit_fn or submit)(args)
        given = [flag for flag, value in (("--namespace", args.namespace), ("--dry-run", args.dry_run),
                                          ("--pvc", args.pvc), ("--master-port", args.master_port),
                                          *((flag_of(key), getattr(args, key)) for key in CLUSTER_SETTINGS))
                 if value is not None and value != [] and value is not False]
        if given:
            raise CLIError(f"{given[0]} needs --backend kubernetes")
        return local_fn(args)

    return run


def add_commands(sub) -> None:
    """The Kubernetes flags on train/status/stop/scale (added after those subcommands)."""
    train = sub.choices["train"]
    add_train_flags(train)
    train.set_defaults(fn=_train_dispatch(train.get_default("fn")))
    for name, fn in (("status", status), ("stop", stop), ("scale", scale), ("suspend", suspend),
                     ("resume", resume)):
        p = sub.choices[name]
        add_job_flags(p)
        p.set_defaults(fn=dispatch(p.get_default("fn"), fn))


# ---- API access ------------------------------------------------------------------------
def _namespace(args) -> str:
    if getattr(args, "namespace", None):
        return args.namespace
    from flextrain.k8s import meta

    if os.environ.get(meta.ENV_NAMESPACE):
        return os.environ[meta.ENV_NAMESPACE]
    try:
        from kubernetes import config

        _, active = config.list_kube_config_contexts()
        return (active or {}).get("context", {}).get("namespace") or "default"
    except Exception:  # noqa: BLE001 - no kubeconfig (in a pod): the pod's own namespace
        return meta.current_namespace()


def _kube():
    from flextrain.operator.kube import Kube

    return Kube(api_client())


# ---- train --backend kubernetes -------------------------------------------------------------
def _inline_trace(value: str) -> str:
    """``--batch-schedule``: a file readable here becomes the ElasticJob's inline trace (checked, naming
    its line, by the operator); anything else stays a path inside the pods (checked by the master)."""
    path = Path(value)
    return path.read_text() if value != "adaptive" and "\n" not in value.strip() and path.is_file() else value


def elasticjob_from_args(args) -> dict:
    """The ElasticJob ``flextrain train --backend kubernetes`` submits (paths as given: they are in-pod)."""
    from flextrain.job import Backend, JobSpecError
    from flextrain.k8s.resource import DEFAULT_JOBS_ROOT

    if args.resume:
        raise CLIError("--resume is for local jobs; a Kubernetes job's relaunched master resumes by itself")
    if getattr(args, "overwrite", False):
        raise CLIError("--overwrite is for local jobs; a new ElasticJob's master moves an earlier job's state "
                       "in its job directory aside by itself")
    missing = [f for f in ("model_def", "training_data") if not getattr(args, f)]
    if missing:
        raise CLIError(f"--{missing[0].replace('_', '-')} is required")
    try:
        spec = build_spec(args)
        name = spec.name
        in_pod = {"model_def": args.model_def, "training_data": args.training_data,
                  "validation_data": args.validation_data,
                  "job_dir": args.job_dir or f"{DEFAULT_JOBS_ROOT}/{name}"}
        if getattr(args, "prediction_data", None) is not None:
            in_pod["prediction_data"] = args.prediction_data
        if args.batch_schedule is not None:  # a trace on this machine travels inline; else a path in the pods
            in_pod["batch_schedule"] = _inline_trace(args.batch_schedule)
        spec = accelerate_in_spec(spec.replace(backend=Backend.KUBERNETES, **in_pod, **cluster_settings(args)).validate())
        check_memory_flag(spec)
    except JobSpecError as exc:
        raise CLIError(str(exc)) from exc
    return elasticjob_of(spec, args)


def cluster_settings(args) -> dict:
    """The settings only an ElasticJob carries (CLUSTER_SETTINGS) the flags give."""
    cluster = {key: getattr(args, key) for key in CLUSTER_SETTINGS if getattr(args, key) is not None}
    if args.gang == "kueue":  # created suspended: Kueue admits it by setting spec.suspend to false
        cluster["suspend"] = True
    return cluster


def elasticjob_of(spec, args) -> dict:
    """The ElasticJob of a validated JobSpec whose paths are in the pods, with ``--pvc`` volumes,
    ``--image``, ``--namespace`` and ``--master-port`` (train, evaluate and predict share it)."""
    from flextrain.k8s import meta
    from flextrain.k8s.resource import ResourceError, resource_from_jobspec

    volumes = []
    for i, item in enumerate(args.pvc):
        claim, sep, mount = item.partition(":")
        if not sep or not claim or not mount.startswith("/"):
            raise CLIError(f"--pvc {item!r}: expected CLAIM:/mount/path")
        volumes.append({"name": f"pvc-{i}", "mountPath": mount, "persistentVolumeClaim": {"claimName": claim}})
    try:
        body = resource_from_jobspec(spec, image=args.image, namespace=_namespace(args),
                                     pod_fields={"volumes": volumes} if volumes else None)
    except ResourceError as exc:
        raise CLIError(str(exc)) from exc
    if args.master_port is not None:
        if not 0 < args.master_port < 65536:
            raise CLIError(f"--master-port must be a port number (1-65535), got {args.master_port}")
        body["metadata"]["annotations"] = {meta.ANNOTATION_MASTER_PORT: str(args.master_port)}
    return body


def submit(args, body: dict | None = None) -> int:
    """Submit ``body`` (default: the ElasticJob of ``flextrain train``'s flags), or print it with ``--dry-run``."""
    import yaml

    from flextrain.k8s import meta

    body = body or elasticjob_from_args(args)
    if args.dry_run:
        sys.stdout.write(yaml.safe_dump(body, sort_keys=False))
        return 0
    from kubernetes.client.exceptions import ApiException

    kube = _kube()
    md = body["metadata"]
    try:
        kube.custom.create_namespaced_custom_object(meta.GROUP, meta.VERSION, md["namespace"], meta.PLURAL, body,
                                                    _preload_content=False)
    except ApiException as exc:
        if exc.status == 409:
            raise CLIError(f"ElasticJob {md['name']!r} already exists in namespace {md['namespace']!r} "
                           f"(kubectl delete ej/{md['name']} -n {md['namespace']})") from None
        raise CLIError(f"cannot create ElasticJob {md['namespace']}/{md['name']}: {exc.status} {exc.reason}: "
                       f"{_api_message(exc)}") from None
    print(f"elasticjob.{meta.GROUP}/{md['name']} created in namespace {md['namespace']}")
    print(f"  watch:  flextrain status {md['name']} --namespace {md['namespace']}   (or: kubectl get ej -w)")
    return 0


def _api_message(exc) -> str:
    try:
        return json.loads(exc.body).get("message", "")
    except (TypeError, ValueError, AttributeError):
        return str(exc.body or "")


# ---- status / scale / stop -----------------------------------------------------------------
def status(args) -> int:
    namespace = _namespace(args)
    kube = _kube()
    if getattr(args, "watch", False):  # the ElasticJob's status, read again every second
        from flextrain.cli.watch import OVER, watch

        def read() -> tuple[list[str], bool]:
            st = get_job(kube, namespace, args.job).get("status") or {}
            return _status_lines(kube, namespace, args.job, st), st.get("phase") in OVER

        return watch(read)
    st = get_job(kube, namespace, args.job).get("status") or {}
    if args.json:
        print(json.dumps({"name": args.job, "namespace": namespace, **st}, indent=2, sort_keys=True))
        return 0
    print("\n".join(_status_lines(kube, namespace, args.job, st)))
    return 0


def _status_lines(kube, namespace: str, name: str, st: dict) -> list[str]:
    """The readable summary of an ElasticJob's status (and its latest Kubernetes events), a line each."""
    from flextrain.cli.jobs import result_lines
    from flextrain.master.failures import failure_lines

    w, p = st.get("workers") or {}, st.get("progress") or {}
    lines = [f"job       {name}  (ElasticJob in {namespace})",
             f"phase     {st.get('phase', 'Unknown')}" + (f"  - {st['message']}" if st.get("message") else ""),
             f"workers   {w.get('active', 0)} active / {w.get('desired', '?')} desired"
             + "".join(f", {w[k]} {k}" for k in ("pending", "preempted") if w.get(k))
             + (f"  - {w['reason']}" if w.get("reason") else "")]
    if "epoch" in st:
        lines.append(f"epoch     {st['epoch']}   step {st.get('step', 0)}")
    if p:
        lines.append(f"progress  {p.get('recordsDone', 0):,}/{p.get('recordsTotal', 0):,} records "
                     f"({p.get('percent', 0)}%)")
    lines += result_lines(st)
    if st.get("masterRelaunches"):
        lines.append(f"master    relaunched {st['masterRelaunches']} time(s)")
    for event in kube.events(namespace, name)[-5:]:
        lines.append(f"event     {event.get('type', '')[:7]:<7} {event.get('reason', '')}: {event.get('message', '')}")
    return lines + failure_lines(st.get("failure"))


def _live_job(kube, namespace: str, name: str) -> dict:
    job = get_job(kube, namespace, name)
    phase = (job.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        raise CLIError(f"job {name} is not running (phase {phase})")
    return job


def _patch(kube, namespace: str, name: str, patch: dict) -> None:
    from flextrain.k8s.refusals import Refused

    try:
        kube.patch_spec(namespace, name, patch)
    except Refused as exc:
        raise CLIError(str(exc)) from None


def scale(args) -> int:
    import copy

    from flextrain.k8s.resource import ResourceError, jobspec_from_resource

    namespace = _namespace(args)
    kube = _kube()
    job = _live_job(kube, namespace, args.job)
    wanted = copy.deepcopy(job)
    wanted["spec"].setdefault("replicaSpecs", {}).setdefault("worker", {})["replicas"] = args.workers
    try:
        jobspec_from_resource(wanted)
    except ResourceError as exc:
        raise CLIError(f"cannot scale {args.job} to {args.workers} workers: {exc}{_allowed_range(job, exc)}") from exc
    old = job["spec"].get("replicaSpecs", {}).get("worker", {}).get("replicas")
    _patch(kube, namespace, args.job, {"spec": {"replicaSpecs": {"worker": {"replicas": args.workers}}}})
    print(f"{args.job}: spec.replicaSpecs.worker.replicas {old} -> {args.workers} "
          "(the operator relays it to the master)")
    return 0


def _allowed_range(job: dict, refused) -> str:
    """``; allowed: ...minReplicas..maxReplicas = 1..4`` when ``refused`` is about the worker count (as the
    operator's ScaleRejected event says it), so the user sees what to ask for instead; '' otherwise."""
    from flextrain.k8s.resource import ResourceError, jobspec_from_resource, path_of, replica_range

    base = "spec.replicaSpecs.worker"
    if not any(path_of(p) in (f"{base}.minReplicas", f"{base}.maxReplicas", f"{base}.replicas")
               for p in refused.problems):
        return ""
    try:
        lo, hi = replica_range(jobspec_from_resource(job))
    except ResourceError:  # the running spec itself is invalid: no range to offer
        return ""
    return f"; allowed: {base}.minReplicas..maxReplicas = {lo}..{hi}"


def stop(args) -> int:
    from flextrain.k8s import meta

    namespace = _namespace(args)
    kube = _kube()
    _live_job(kube, namespace, args.job)
    _patch(kube, namespace, args.job, {"metadata": {"annotations": {meta.ANNOTATION_STOP: args.reason}}})
    print(f"{args.job}: stop requested (the master stops at the next step boundary, leaving a checkpoint)")
    return 0


def suspend(args) -> int:
    return _set_suspend(args, True)


def resume(args) -> int:
    return _set_suspend(args, False)


def _set_suspend(args, value: bool) -> int:
    """``spec.suspend`` of the ElasticJob: the operator relays it to the master (Kubernetes' Job convention)."""
    namespace = _namespace(args)
    kube = _kube()
    _live_job(kube, namespace, args.job)
    _patch(kube, namespace, args.job, {"spec": {"suspend": value}})
    what = "suspend requested (checkpoint, then every worker pod released)" if value else "resume requested"
    print(f"{args.job}: spec.suspend: {str(value).lower()}: {what}; the operator relays it to the master")
    return 0


__all__ = [
    "add_commands",
    "add_job_flags",
    "add_train_flags",
    "dispatch",
    "cluster_settings",
    "elasticjob_from_args",
    "elasticjob_of",
    "resume",
    "scale",
    "status",
    "suspend",
    "stop",
    "submit",
    "wants_kubernetes",
]
