"""KubernetesPodBackend: the master's launch backend when workers and PS run as Pods.

Same interface and exit semantics as :class:`LocalProcessBackend`:
``launch`` creates the instance's Pod (and, for a PS, its Service);
``terminate`` deletes the Pod (the kubelet sends SIGTERM, then SIGKILL after
the grace period; ``force`` deletes with grace 0); a watch on the job's Pods
turns their fate into ``on_exit(instance_id, code)`` exactly once per launch
(:func:`~flextrain.master.k8s_outcomes.pod_exit`: the container's exit code,
1 for a Pod that failed before its container ran, 137 for a Pod deleted
before it reported an exit).

Relaunch decisions stay with :class:`InstanceManager` (a preempted, killed or
deleted worker is replaced within the relaunch budget). One policy is the
backend's own because only it sees the reason: a PS container ``OOMKilled``
more than ``max_oom_kills`` times is not retried again (an OOMKilled worker is the
master's to handle, through :meth:`exit_reason`: flextrain/master/oom.py); the job is
failed through ``on_fatal`` with a message naming OOMKilled and what to change,
and later launches are refused (logged) since the job is over.

Creates the API server refuses (:mod:`flextrain.master.k8s_outcomes`):

* permanently (422 Invalid, 403 by admission, 400, ...): the job fails through
  ``on_fatal`` with ``cannot create pod "NAME": the API server refused it (CODE
  REASON): <its Status message>``, a Warning Event ``FailedCreate`` is recorded
  on the ElasticJob, the instance is reported as exited (code 1) and later
  launches are refused;
* retryably (403 ``exceeded quota``, 409, 429, 5xx, no answer): ``launch``
  returns at once and a thread tries again after ``retry_first`` seconds,
  doubling up to ``retry_cap``, for as long as the instance is wanted
  (``terminate``/``close`` end it, reporting the instance as exited with 137).
  Each new reason goes to ``on_note`` (the job's status message: ``waiting for
  quota: pods "NAME" is forbidden: exceeded quota ...``) and into a Warning
  Event ``FailedCreate``; the create that finally succeeds is noted too. The
  instance counts as running and Pending meanwhile, so it is neither replaced
  nor taken for a hung worker.

A Pending Pod counts as running (it was launched and has not exited) but
never blocks training: rendezvous rounds count registered workers only.

Failed pods: once a failed Pod's exit has been reported (the master judged it
and read its termination message), the backend deletes the older failed Pods
of the same role, keeping the latest one and those ``keep_failed()`` names
(the master's root cause, whose ``kubectl logs`` its failure message cites).
A PS relaunch reuses its Pod's name, so a PS never leaves more than one.

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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flextrain.k8s import meta
from flextrain.k8s.pods import (
    avoid_nodes,
    instance_pod,
    instance_pod_name,
    ps_port,
    ps_service,
    service_address,
)
from flextrain.k8s.watch import ObjectWatch
from flextrain.master.k8s_create import LaunchError, PodCreation
from flextrain.master.k8s_outcomes import (
    KILLED,
    OOM_KILLED,
    disruption,
    oom_message,
    pod_exit,
    termination_message,
    unscheduled_reason,
)
from flextrain.master.k8s_priority import PriorityClasses
from flextrain.master.k8s_status import record_event
from flextrain.master.launcher import InstanceSpec, LaunchBackend, PSEndpoint, Role

log = logging.getLogger(__name__)

DEFAULT_MAX_OOM_KILLS = 2
_ROLES = {Role.WORKER.value, Role.PS.value}

@dataclass
class _Instance:
    instance_id: str
    role: str
    pod: str
    uid: str | None = None  # None until the API accepted the Pod
    phase: str = "Pending"
    reported: bool = False
    reason: str | None = None
    code: int | None = None
    created: float = 0.0  # monotonic time the API accepted the Pod
    output: str = ""  # the container's termination message: the end of its log when it failed
    attempts: int = 0  # creates tried
    priority: str | None = None  # a worker pod's PriorityClass (flextrain.master.k8s_priority)
    disruption: str | None = None  # why the cluster took the pod away (preempted, evicted), if it did
    unscheduled: str | None = None  # the scheduler's reason while the pod waits for a node
    cancel: threading.Event = field(default_factory=threading.Event)  # stop retrying the create


@dataclass
class PodExits:
    """What the backend saw: exits with reasons, OOM kills by role (for status and tests)."""

    exits: list[tuple[str, int, str]] = field(default_factory=list)
    oom_kills: dict[str, int] = field(default_factory=dict)


class KubernetesPodBackend(PodCreation, LaunchBackend):
    def __init__(self, api_client, *, job: Mapping[str, Any], master_address: str,
                 max_oom_kills: int = DEFAULT_MAX_OOM_KILLS,
                 on_fatal: Callable[[str], None] = lambda message: None,
                 on_note: Callable[[str], None] = lambda message: None,
                 keep_failed: Callable[[], Iterable[str]] = lambda: (),
                 create_timeout: float = 60.0, retry_first: float = 0.5, retry_cap: float = 30.0,
                 resync_interval: float = 10.0) -> None:
        """``create_timeout`` bounds the retries of a PS Service's create (``ps_endpoint`` waits for
        it); a Pod's create is retried with backoff from ``retry_first`` to ``retry_cap`` seconds."""
        from kubernetes import client

        super().__init__()
        self.core = client.CoreV1Api(api_client)
        self.job = job
        self.job_name = job["metadata"]["name"]
        self.namespace = job["metadata"]["namespace"]
        self.master_address = master_address
        self.max_oom_kills = max_oom_kills
        self.create_timeout = create_timeout
        self.retry_first, self.retry_cap = retry_first, retry_cap
        self.resync_interval = resync_interval
        self.priorities = PriorityClasses(job)
        self._stopped = threading.Event()
        self._on_fatal, self._on_note, self._keep_failed = on_fatal, on_note, keep_failed
        self._lock = threading.RLock()
        self._instances: dict[str, _Instance] = {}  # by instance id (latest launch)
        self._by_pod: dict[str, _Instance] = {}
        self._failed_pods: dict[str, list[_Instance]] = {}  # by role: failed pods still there, oldest first
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
        """Create the instance's Pod; returns once the API accepted it, refused it for good (the job
        fails), or refused it for now (retried in the background; see the module docstring)."""
        role = spec.role.value
        name = instance_pod_name(self.job_name, spec.instance_id)
        service = ps_service(self.job, index=spec.index) if spec.role is Role.PS else None
        with self._lock:
            if self.failed or self.closed:
                log.warning("not launching %s: %s", spec.instance_id, self.failed or "backend closed")
                return
            old = self._instances.get(spec.instance_id)
            if old is not None and not old.reported:
                raise LaunchError(f"{spec.instance_id} is already running as pod {old.pod}")
            priority = self.priorities.choose(
                (i.priority for i in self._instances.values() if i.role == role and not i.reported),
                spare=spec.spare) if spec.role is Role.WORKER else None
            body = instance_pod(self.job, role=role, index=spec.index, instance_id=spec.instance_id,
                                args=spec.args, env=spec.env, master_address=self.master_address, spare=spec.spare,
                                priority_class_name=priority, memory=spec.memory)
            avoid_nodes(body, spec.avoid_nodes)  # a replaced slow worker's node, for a while
            inst = self._instances[spec.instance_id] = _Instance(spec.instance_id, role, name, priority=priority)
            refusal = self._attempt(inst, body, service)
        if refusal is None:
            log.info("created pod %s for %s", name, spec.instance_id)
        elif refusal.retryable:
            threading.Thread(target=self._keep_trying, args=(inst, body, service, refusal), daemon=True,
                             name=f"create-{name}").start()
        else:
            self._refused(inst, refusal)

    def report(self, *, reason: str, message: str) -> None:
        record_event(self.core, self.job, reason=reason, message=message)

    def promote(self, instance_id: str) -> None:
        """A spare was taken: its pod's ``flextrain.dev/spare`` label becomes "false" (what users and tools
        see; the spare itself learns it from its Park poll, so a failed patch only leaves the label stale)."""
        from kubernetes.client import ApiException

        with self._lock:
            inst = self._instances.get(instance_id)
        if inst is None:
            return
        try:
            self.core.patch_namespaced_pod(inst.pod, self.namespace,
                                           {"metadata": {"labels": {meta.LABEL_SPARE: "false"}}})
        except ApiException as exc:
            log.warning("could not relabel pod %s as taken: %s %s", inst.pod, exc.status, exc.reason)

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
            if inst is None or inst.reported:
                return
            never_created = inst.uid is None
            if never_created:  # its create is being retried: stop that; there is no Pod to delete
                inst.cancel.set()
        if never_created:
            self._report(instance_id, KILLED, "NotCreated")
        else:
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
        """Instances whose Pod has not started running yet (not created yet, unscheduled, pulling, ...)."""
        with self._lock:
            return {i for i, inst in self._instances.items() if not inst.reported and inst.phase == "Pending"}

    def disruption(self, instance_id: str) -> str | None:
        """Why the cluster took the instance's pod away (``PreemptionByScheduler``, ``Evicted``), if it did."""
        with self._lock:
            inst = self._instances.get(instance_id)
        return inst.disruption if inst else None

    def pending_reason(self, instance_ids: Iterable[str]) -> str | None:
        """The scheduler's reason why one of these instances' pods waits for a node (``Unschedulable: ...``)."""
        with self._lock:
            return next((inst.unscheduled for i in instance_ids
                         if (inst := self._instances.get(i)) is not None and inst.unscheduled), None)

    def close(self, *, grace: float = 5.0) -> None:
        with self._lock:
            self.closed = True
            live = [inst for inst in self._instances.values() if not inst.reported]
        for inst in live:
            if inst.uid is None:
                self.terminate(inst.instance_id)  # still being created: stop that
            else:
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
            inst.unscheduled = unscheduled_reason(pod) if inst.phase == "Pending" else None
            inst.disruption = inst.disruption or disruption(pod)  # marked before the pod ends, kept once seen
            ended = pod_exit(kind, pod)
            if ended is not None:
                inst.output = termination_message(pod)
            # A pod that failed by itself while the job ran (not one deleted, or killed by close()).
            failed = ended is not None and ended[0] != 0 and kind != "DELETED" and not self.closed
        if ended is not None:
            self._report(inst.instance_id, *ended)
        if failed:
            self._prune_failed(inst)

    def _report(self, instance_id: str, code: int, reason: str) -> None:
        fatal = None
        with self._lock:
            inst = self._instances.get(instance_id)
            if inst is None or inst.reported:
                return
            inst.reported, inst.code, inst.reason = True, code, reason
            self.seen.exits.append((instance_id, code, reason))
            # Workers: the master lowers their micro-batch or climbs the memory ladder (flextrain/master/oom.py).
            if reason == OOM_KILLED and not self.closed and inst.role != Role.WORKER.value:
                n = self.seen.oom_kills[inst.role] = self.seen.oom_kills.get(inst.role, 0) + 1
                if n > self.max_oom_kills and not self.failed:
                    fatal = self.failed = oom_message(inst.role, instance_id, n, self.max_oom_kills)
        log.info("%s (pod %s) exited with code %d (%s)", instance_id, inst.pod, code, reason)
        if fatal:
            self._on_fatal(fatal)
        self._on_exit(instance_id, code)

    def exit_reason(self, instance_id: str) -> str:
        """The reason of an exited instance's container or pod (``OOMKilled``, ``Error``, ``Deleted``...)."""
        with self._lock:
            inst = self._instances.get(instance_id)
            return (inst.reason or "") if inst is not None and inst.reported else ""

    def _prune_failed(self, failed: _Instance) -> None:
        """``failed``'s exit has been judged (its message read): delete the older failed Pods of its
        role, except those the master still cites (``keep_failed``)."""
        keep = set(self._keep_failed())  # first, without our lock: the master takes its own
        with self._lock:
            pods = self._failed_pods.setdefault(failed.role, [])
            pods[:] = [p for p in pods if p.pod != failed.pod] + [failed]  # a PS reuses its name
            stale = [p for p in pods[:-1] if p.instance_id not in keep]
            pods[:] = [p for p in pods if p not in stale]
        for inst in stale:
            log.info("deleting failed pod %s (a later one of its role is kept)", inst.pod)
            self._delete(inst.pod, grace=0)


def _ours(pod: Mapping[str, Any], job_name: str) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(meta.LABEL_JOB) == job_name and labels.get(meta.LABEL_ROLE) in _ROLES


__all__ = [
    "KubernetesPodBackend",
    "LaunchError",
]
