"""KubernetesPodBackend: the master's launch backend when workers and PS run as Pods.

Same interface and exit semantics as :class:`LocalProcessBackend`:
``launch`` creates the instance's Pod (and, for a PS, its Service), returning
once the API accepted it; ``terminate`` deletes the Pod (the kubelet sends
SIGTERM, then SIGKILL after the grace period; ``force`` deletes with grace 0);
a watch on the job's Pods turns their fate into ``on_exit(instance_id, code)``
exactly once per launch:

* phase ``Succeeded``/``Failed``: the container's ``exitCode`` (1 when the Pod
  failed before its container ran, e.g. evicted or unschedulable config);
* the Pod deleted before it reported an exit (preempted, ``kubectl delete``,
  node lost): 137, as a container killed by SIGKILL.

Relaunch decisions stay with :class:`InstanceManager` (a preempted, killed or
deleted worker is replaced within the relaunch budget). One policy is the
backend's own because only it sees the reason: a container ``OOMKilled``
more than ``max_oom_kills`` times in a role is not retried again; the job is
failed through ``on_fatal`` with a message naming OOMKilled and what to change,
and later launches are refused (logged) since the job is over. A Pod the API
does not accept (refused, or the API unreachable for ``create_timeout``
seconds) is reported through ``on_note`` with the reason and as an exit with
code 1, so the relaunch budget bounds the retries.

A Pending Pod counts as running (it was launched and has not exited) but
never blocks training: rendezvous rounds count registered workers only.

Besides the watch, a periodic resync (every ``resync_interval`` seconds)
lists the job's Pods, so a Pod deleted while the watch was reconnecting is
still reported.

On start, the backend deletes Pods of the job's workers and PS left by a
previous master (a relaunched master resumes from its checkpoint; their
state is stale), so names never collide.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flextrain.job import JobSpec
from flextrain.k8s import meta
from flextrain.k8s.pods import (
    instance_pod,
    instance_pod_name,
    ps_port,
    ps_service,
    service_address,
)
from flextrain.k8s.watch import ObjectWatch
from flextrain.master.launcher import InstanceSpec, LaunchBackend, PSEndpoint, Role

log = logging.getLogger(__name__)

KILLED = 137  # what a container killed by SIGKILL reports
OOM_KILLED = "OOMKilled"
DEFAULT_MAX_OOM_KILLS = 2
_ROLES = {Role.WORKER.value, Role.PS.value}


class LaunchError(RuntimeError):
    """The API refused to create an instance's Pod (the message names Pod and reason)."""


@dataclass
class _Instance:
    instance_id: str
    role: str
    pod: str
    uid: str | None = None
    phase: str = "Pending"
    reported: bool = False
    reason: str | None = None
    code: int | None = None
    created: float = 0.0  # monotonic time the API accepted the Pod
    output: str = ""  # the container's termination message: the end of its log when it failed


@dataclass
class PodExits:
    """What the backend saw: exits with reasons, OOM kills by role (for status and tests)."""

    exits: list[tuple[str, int, str]] = field(default_factory=list)
    oom_kills: dict[str, int] = field(default_factory=dict)


def pod_exit(kind: str, pod: Mapping[str, Any]) -> tuple[int, str] | None:
    """``(exit code, reason)`` if this event ends the Pod's container, else None."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    term = next((cs["state"]["terminated"] for cs in status.get("containerStatuses") or []
                 if (cs.get("state") or {}).get("terminated")), None)
    if phase in ("Succeeded", "Failed"):
        code = term["exitCode"] if term else (0 if phase == "Succeeded" else 1)
        reason = (term or {}).get("reason") or status.get("reason") or ("Completed" if code == 0 else "Error")
        return int(code), reason
    if kind == "DELETED":
        return (int(term["exitCode"]), term.get("reason") or "Error") if term else (KILLED, "Deleted")
    return None


class KubernetesPodBackend(LaunchBackend):
    def __init__(self, api_client, *, job: Mapping[str, Any], master_address: str,
                 max_oom_kills: int = DEFAULT_MAX_OOM_KILLS,
                 on_fatal: Callable[[str], None] = lambda message: None,
                 on_note: Callable[[str], None] = lambda message: None,
                 create_timeout: float = 60.0, resync_interval: float = 10.0) -> None:
        from kubernetes import client

        super().__init__()
        self.core = client.CoreV1Api(api_client)
        self.job = job
        self.job_name = job["metadata"]["name"]
        self.namespace = job["metadata"]["namespace"]
        self.master_address = master_address
        self.max_oom_kills = max_oom_kills
        self.create_timeout = create_timeout
        self.resync_interval = resync_interval
        self._stopped = threading.Event()
        self._on_fatal, self._on_note = on_fatal, on_note
        self._lock = threading.RLock()
        self._instances: dict[str, _Instance] = {}  # by instance id (latest launch)
        self._by_pod: dict[str, _Instance] = {}
        self.seen = PodExits()
        self.failed: str | None = None
        self.closed = False
        self._watch = ObjectWatch(self.core.list_namespaced_pod, self.namespace, handler=self._on_pod,
                                  label_selector=meta.selector(self.job_name), name=f"pods-{self.job_name}")

    def start(self, *, timeout: float = 30.0) -> KubernetesPodBackend:
        """Remove a previous master's worker/PS pods, then start watching."""
        for pod in self._job_pods():
            self._delete(pod["metadata"]["name"], grace=0)
        self._watch.start()
        threading.Thread(target=self._resync_loop, daemon=True, name=f"resync-{self.job_name}").start()
        if not self._watch.connected.wait(timeout):
            raise LaunchError(f"could not watch pods in namespace {self.namespace} within {timeout:.0f}s")
        return self

    def _job_pods(self) -> list[dict]:
        reply = self.core.list_namespaced_pod(self.namespace, label_selector=meta.selector(self.job_name),
                                              _preload_content=False)
        items = json.loads(reply.data).get("items") or []
        return [p for p in items if _ours(p, self.job_name)]

    # ---- LaunchBackend ---------------------------------------------------------
    def launch(self, spec: InstanceSpec) -> None:
        role = spec.role.value
        name = instance_pod_name(self.job_name, spec.instance_id)
        body = instance_pod(self.job, role=role, index=spec.index, instance_id=spec.instance_id,
                            args=spec.args, env=spec.env, master_address=self.master_address)
        with self._lock:
            if self.failed or self.closed:
                log.warning("not launching %s: %s", spec.instance_id, self.failed or "backend closed")
                return
            inst = _Instance(spec.instance_id, role, name)
            old = self._instances.get(spec.instance_id)
            if old is not None and not old.reported:
                raise LaunchError(f"{spec.instance_id} is already running as pod {old.pod}")
            self._instances[spec.instance_id] = inst
            try:
                if spec.role is Role.PS:
                    self._ensure_service(ps_service(self.job, index=spec.index))
                # Held across the create so the watch cannot see the new Pod before its uid is known.
                created = self._create(body)
            except LaunchError as exc:
                # Reported as an exit (code 1) so the relaunch budget applies; from another
                # thread, since the caller may hold its own lock while launching.
                self._on_note(str(exc))
                threading.Thread(target=self._report, args=(spec.instance_id, 1, "LaunchFailed"),
                                 daemon=True).start()
                return
            inst.uid, inst.created = created["metadata"].get("uid"), time.monotonic()
            self._by_pod[name] = inst
        log.info("created pod %s for %s", name, spec.instance_id)

    def _create(self, body: dict) -> dict:
        """Create a Pod; a leftover of the same name (a finished earlier launch) is deleted first."""
        from kubernetes.client import ApiException

        name = body["metadata"]["name"]
        deadline = time.monotonic() + self.create_timeout
        while True:
            try:
                reply = self.core.create_namespaced_pod(self.namespace, body, _preload_content=False)
                return json.loads(reply.data)
            except ApiException as exc:
                if time.monotonic() > deadline:
                    raise LaunchError(f"pod {name}: the API kept refusing it: {exc.status} {exc.reason}") from None
                if exc.status == 409:
                    self._delete(name, grace=0)
                elif exc.status is not None and 400 <= exc.status < 500:
                    raise LaunchError(f"pod {name} was refused by the API: {exc.status} {exc.reason}: "
                                      f"{(exc.body or '')[:300]}") from None
            except Exception as exc:  # noqa: BLE001 - connection trouble: retry until the deadline
                if time.monotonic() > deadline:
                    raise LaunchError(f"pod {name}: could not reach the API: {exc}") from None
            time.sleep(0.2)

    def _ensure_service(self, body: dict) -> dict:
        """Create the Service (or find it: a relaunched PS keeps its Service); returns it."""
        from kubernetes.client import ApiException

        name = body["metadata"]["name"]
        try:
            reply = self.core.create_namespaced_service(self.namespace, body, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                raise LaunchError(f"service {name}: {exc.status} {exc.reason}") from None
            reply = self.core.read_namespaced_service(name, self.namespace, _preload_content=False)
        return json.loads(reply.data)

    def ps_endpoint(self, index: int) -> PSEndpoint:
        """PS ``index`` listens on every interface of its pod; workers dial its Service ``<job>-ps-<i>``."""
        port = ps_port(self.job, index)
        service = self._ensure_service(ps_service(self.job, index=index))
        return PSEndpoint(listen_host="0.0.0.0", port=port,
                          address=service_address(service, default_port=port))

    def _delete(self, pod: str, *, grace: int | None) -> None:
        from kubernetes import client
        from kubernetes.client import ApiException

        try:
            body = client.V1DeleteOptions(grace_period_seconds=grace) if grace is not None else None
            self.core.delete_namespaced_pod(pod, self.namespace, body=body)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("deleting pod %s failed: %s %s", pod, exc.status, exc.reason)
        except Exception as exc:  # noqa: BLE001 - best effort: the watch still reports the pod's end
            log.warning("deleting pod %s failed: %s", pod, exc)

    def terminate(self, instance_id: str, *, force: bool = False) -> None:
        with self._lock:
            inst = self._instances.get(instance_id)
        if inst is not None and not inst.reported:
            self._delete(inst.pod, grace=0 if force else None)

    def running(self) -> set[str]:
        with self._lock:
            return {i for i, inst in self._instances.items() if not inst.reported}

    def log_location(self, instance_id: str) -> str:
        with self._lock:
            inst = self._instances.get(instance_id)
        return f"kubectl logs -n {self.namespace} {inst.pod}" if inst else ""

    def output_tail(self, instance_id: str) -> str:
        with self._lock:
            inst = self._instances.get(instance_id)
        if inst is None:
            return ""
        reason = f"[{inst.reason}] " if inst.reason and inst.reason not in ("Error", "Completed") else ""
        return reason + inst.output

    def pending(self) -> set[str]:
        """Instances whose Pod has not started running yet (unscheduled, pulling, ...)."""
        with self._lock:
            return {i for i, inst in self._instances.items() if not inst.reported and inst.phase == "Pending"}

    def close(self, *, grace: float = 5.0) -> None:
        with self._lock:
            self.closed = True
            live = [inst for inst in self._instances.values() if not inst.reported]
        for inst in live:
            self._delete(inst.pod, grace=max(0, int(grace)))
        deadline = time.monotonic() + grace + 10.0
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        for instance_id in self.running():  # the watch missed them: report them gone
            self._report(instance_id, KILLED, "Deleted")
        self._stopped.set()
        self._watch.stop()

    # ---- watch ------------------------------------------------------------------
    def _resync_loop(self) -> None:
        while not self._stopped.wait(self.resync_interval):
            try:
                self.resync()
            except Exception as exc:  # noqa: BLE001 - the API may be briefly away: next period
                log.debug("pod resync failed: %s", exc)

    def resync(self) -> None:
        """Compare with a fresh listing: catches what a broken watch missed.

        A watch that reconnects replays the Pods that exist, but not the ones
        deleted while it was away; an instance whose Pod (created before the
        listing began) is absent is reported as deleted (137).
        """
        began = time.monotonic()
        pods = {p["metadata"]["name"]: p for p in self._job_pods()}
        for pod in pods.values():
            self._on_pod("MODIFIED", pod)
        with self._lock:
            gone = [inst.instance_id for inst in self._instances.values()
                    if not inst.reported and inst.uid and inst.created < began
                    and (inst.pod not in pods or pods[inst.pod]["metadata"].get("uid") != inst.uid)]
        for instance_id in gone:
            self._report(instance_id, KILLED, "Deleted")

    def _on_pod(self, kind: str, pod: dict) -> None:
        if not _ours(pod, self.job_name):
            return
        md = pod["metadata"]
        with self._lock:
            inst = self._by_pod.get(md["name"])
            if inst is None or inst.reported or (inst.uid and md.get("uid") != inst.uid):
                return
            inst.phase = (pod.get("status") or {}).get("phase") or inst.phase
            ended = pod_exit(kind, pod)
            if ended is not None:
                inst.output = termination_message(pod)
        if ended is not None:
            self._report(inst.instance_id, *ended)

    def _report(self, instance_id: str, code: int, reason: str) -> None:
        fatal = None
        with self._lock:
            inst = self._instances.get(instance_id)
            if inst is None or inst.reported:
                return
            inst.reported, inst.code, inst.reason = True, code, reason
            self.seen.exits.append((instance_id, code, reason))
            if reason == OOM_KILLED and not self.closed:
                n = self.seen.oom_kills[inst.role] = self.seen.oom_kills.get(inst.role, 0) + 1
                if n > self.max_oom_kills and not self.failed:
                    fatal = self.failed = oom_message(inst.role, instance_id, n, self.max_oom_kills)
        log.info("%s (pod %s) exited with code %d (%s)", instance_id, inst.pod, code, reason)
        if fatal:
            self._on_fatal(fatal)
        self._on_exit(instance_id, code)


def termination_message(pod: Mapping[str, Any]) -> str:
    """The terminated container's message (``FallbackToLogsOnError``: its last log lines)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if (term := (cs.get("state") or {}).get("terminated")) and term.get("message"):
            return str(term["message"])
    return ""


def oom_message(role: str, instance_id: str, kills: int, limit: int) -> str:
    more = (f"spec.replicaSpecs.{role}.resources.limits.memory")
    smaller = " or a smaller spec.training.maxMicroBatch" if role == Role.WORKER.value else ""
    return (f"{role} pods were OOMKilled {kills} times (last: {instance_id}; at most {limit} are retried): "
            f"give them more memory ({more}){smaller}")


def _ours(pod: Mapping[str, Any], job_name: str) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(meta.LABEL_JOB) == job_name and labels.get(meta.LABEL_ROLE) in _ROLES


@dataclass(frozen=True)
class KubernetesContext:
    """What ``run_master`` needs to run a job's instances as Pods."""

    backend: KubernetesPodBackend
    job: Mapping[str, Any]  # the ElasticJob as read at start
    master_address: str  # what workers dial: the master Service
    api_client: Any


def kubernetes_context(spec: JobSpec, *, namespace: str | None = None, api_client=None,
                       on_fatal: Callable[[str], None] = lambda message: None,
                       on_note: Callable[[str], None] = lambda message: None) -> KubernetesContext:
    """Read the job's ElasticJob and master Service and build its pod backend.

    ``api_client`` defaults to in-cluster config (else kubeconfig); ``namespace``
    to the pod's own. Raises LaunchError naming what is missing.
    """
    from kubernetes import client
    from kubernetes.client import ApiException

    if api_client is None:
        meta.load_client_config()
        api_client = client.ApiClient()
    namespace = namespace or meta.current_namespace()
    try:
        job = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
            meta.GROUP, meta.VERSION, namespace, meta.PLURAL, spec.name)
    except ApiException as exc:
        raise LaunchError(f"ElasticJob {namespace}/{spec.name}: cannot read it: {exc.status} {exc.reason}") from None
    service = meta.master_service_name(spec.name)
    try:
        svc = client.CoreV1Api(api_client).read_namespaced_service(service, namespace, _preload_content=False)
    except ApiException as exc:
        raise LaunchError(f"Service {namespace}/{service} (the master's address for workers): "
                          f"{exc.status} {exc.reason}; the operator creates it with the master pod") from None
    address = service_address(json.loads(svc.data), default_port=meta.MASTER_PORT)
    backend = KubernetesPodBackend(api_client, job=job, master_address=address, on_fatal=on_fatal,
                                   on_note=on_note)
    return KubernetesContext(backend=backend, job=job, master_address=address, api_client=api_client)


__all__ = [
    "KubernetesContext",
    "KubernetesPodBackend",
    "LaunchError",
    "kubernetes_context",
    "oom_message",
    "pod_exit",
]
