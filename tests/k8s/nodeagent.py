"""A test-only node agent: runs the Pods of the emulated cluster as local processes.

It plays the kubelet of a one-node cluster: it watches Pods through the real
``kubernetes`` client, runs each Pod's first container (``command`` + ``args``,
with the Pod's ``env``) as a child process and writes back what a kubelet
would: ``phase`` Pending -> Running -> Succeeded/Failed, ``podIP``/``hostIP``
``127.0.0.1``, ``startTime``, the ``Ready`` condition, and ``containerStatuses``
with ``state.running`` / ``state.terminated`` (``exitCode``, ``reason``
``Completed`` / ``Error`` / ``OOMKilled``).

Contract:

* Command: an empty ``command`` means the image's entrypoint, ``flextrain``;
  ``flextrain`` runs as ``<this python> -m flextrain`` (the repo's venv), and
  ``python``/``python3`` as this interpreter. Each process runs in its own
  session in ``<log_dir>/<namespace>/<pod>/``; its output goes to
  ``<log_dir>/<namespace>/<pod>.log`` (:meth:`NodeAgent.log`).
* Image cache: a ``flextrain`` Pod is forked from a zygote (flextrain/zygote.py: torch already
  imported; the child runs ``python -m flextrain ARGS`` as a fresh process would) once one is
  ready, as a node's warm image cache spares a container its pull: the first such Pod starts the
  zygote (with that Pod's environment as far as it is read at import time, ``PYTHON*``, ``TORCH*``,
  ...: the same for all of flextrain's Pods) and runs fresh, as does any Pod whose environment differs
  there (``Zygote.serves``). ``FLEXTRAIN_ZYGOTE=0`` runs every Pod fresh.
* Environment: not inherited from the test (a container's is not), except
  ``PATH``/``HOME``/``LANG``; ``KUBECONFIG`` points at the emulator (standing
  in for the mounted ServiceAccount token); ``env[].valueFrom.fieldRef`` is
  resolved for ``metadata.name|namespace|uid``, ``metadata.labels['k']``,
  ``metadata.annotations['k']``, ``spec.nodeName``, ``spec.serviceAccountName``
  and ``status.podIP|hostIP`` (``127.0.0.1``). Other ``valueFrom`` sources fail
  the Pod with reason ``CreateContainerConfigError`` naming the variable.
* Volumes: a ``secret`` volume is read from the API when the Pod starts and its keys written as files
  (mode ``defaultMode``, else 0644) to ``<log_dir>/<namespace>/<pod>/volumes/<volume>/``; a missing Secret
  or key fails the Pod (``CreateContainerConfigError``). The process cannot see the container's
  ``mountPath``, so an env value naming a mounted path (or a file under it) is rewritten to the local
  directory. Other volumes are not mounted (paths in tests are host paths already; an
  ``emptyDir`` at ``/tmp`` is the host's ``/tmp``, so ``HOME=/tmp/home`` is shared by
  the pods of a test), and the root filesystem is not made read-only: tests assert
  ``readOnlyRootFilesystem`` on the pod specs.
* Networking: every Pod's IP is ``127.0.0.1`` and every Service's clusterIP is
  ``127.0.0.1`` (the emulator assigns it); there is no kube-proxy, so a
  Service's port must be the port its backing process listens on, and the
  processes of one test must listen on distinct ports.
* Deletion: the agent puts its finalizer on every Pod it starts, so deleting a
  Pod is graceful as on a real node: SIGTERM, then SIGKILL after
  ``deletionGracePeriodSeconds`` (the delete's ``gracePeriodSeconds``, else
  the Pod's ``terminationGracePeriodSeconds``, else 30); ``gracePeriodSeconds=0``
  kills at once (exit code 137). The terminated status is written before the
  finalizer is removed, so watchers see the exit code; then the Pod is gone.
* Pending: a Pod annotated ``nodeagent.flextrain.dev/hold: "true"``, or any Pod
  beyond ``max_pods`` running ones, stays ``Pending`` with condition
  ``PodScheduled=False, reason Unschedulable``; removing the annotation (or a
  free slot, or more room from :meth:`NodeAgent.set_capacity`) starts it.
* Faults: :meth:`NodeAgent.oom_kill` SIGKILLs a Pod's process and reports
  ``OOMKilled`` (exit 137); :meth:`NodeAgent.preempt` marks the Pod with a
  ``DisruptionTarget`` condition and deletes it, as the scheduler does.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from flextrain.k8s.watch import ObjectWatch
from flextrain.zygote import IMPORT_TIME, ForkedProcess, Zygote, ZygoteGone

log = logging.getLogger(__name__)

HOLD_ANNOTATION = "nodeagent.flextrain.dev/hold"
FINALIZER = "nodeagent.flextrain.dev/process"
NODE_NAME = "flextrain-test-node"
POD_IP = "127.0.0.1"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class PodConfigError(Exception):
    """A Pod this agent cannot run as given (the message names the field)."""


@dataclass
class _Run:
    namespace: str
    name: str
    uid: str
    proc: subprocess.Popen | ForkedProcess
    started: str
    reason: str | None = None  # set when the agent itself kills it (OOMKilled)
    terminating: bool = False
    gone: bool = False  # the Pod object no longer exists
    exit_code: int | None = None
    done: threading.Event = field(default_factory=threading.Event)


class NodeAgent:
    def __init__(self, api_client, *, kubeconfig: Path, log_dir: Path, namespace: str | None = None,
                 max_pods: int | None = None) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self._api_client = api_client
        self.kubeconfig = Path(kubeconfig)
        self.log_dir = Path(log_dir)
        self.namespace = namespace
        self.max_pods = max_pods
        self._lock = threading.RLock()
        self._runs: dict[str, _Run] = {}  # by pod uid
        self._waiting: dict[str, dict] = {}  # uid -> pod held Pending
        self._refused: set[str] = set()
        self.started_pods: list[str] = []  # names, in start order
        self._closed = False
        self._zygote: Zygote | None = None  # None until the first flextrain Pod (or with FLEXTRAIN_ZYGOTE=0)
        self._zygote_started = False
        self.forked_pods: list[str] = []  # names of the Pods forked from the zygote
        if namespace:
            self._watch = ObjectWatch(self.core.list_namespaced_pod, namespace, handler=self._on_event,
                                      name="nodeagent")
        else:
            self._watch = ObjectWatch(self.core.list_pod_for_all_namespaces, handler=self._on_event,
                                      name="nodeagent")

    def start(self) -> NodeAgent:
        self._watch.start()
        if not self._watch.connected.wait(15):
            raise RuntimeError("node agent: could not open a watch on pods")
        return self

    # ---- events -------------------------------------------------------------
    def _on_event(self, kind: str, pod: dict) -> None:
        md = pod["metadata"]
        uid = md.get("uid") or f"{md.get('namespace')}/{md['name']}"
        with self._lock:
            if self._closed:
                return
            run = self._runs.get(uid)
            if kind == "DELETED":
                self._waiting.pop(uid, None)
                if run is not None:
                    run.gone = True
                    self._signal(run, signal.SIGKILL)
                return
            if md.get("deletionTimestamp"):
                self._waiting.pop(uid, None)
                if run is None or run.done.is_set():
                    self._release(pod)
                elif not run.terminating:
                    run.terminating = True
                    grace = md.get("deletionGracePeriodSeconds")
                    if grace is None:
                        grace = pod.get("spec", {}).get("terminationGracePeriodSeconds", 30)
                    self._terminate(run, float(grace))
                return
            if run is not None or uid in self._refused:
                return
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                return
            held = (md.get("annotations") or {}).get(HOLD_ANNOTATION) == "true"
            full = self.max_pods is not None and self._active() >= self.max_pods
            if held or full:
                if uid not in self._waiting:
                    self._waiting[uid] = pod
                    why = "held by annotation " + HOLD_ANNOTATION if held else f"node full ({self.max_pods} pods)"
                    self._patch_status(pod, {"phase": "Pending", "conditions": [{
                        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": f"0/1 nodes are available: {why}", "lastTransitionTime": _now()}]})
                else:
                    self._waiting[uid] = pod
                return
            self._waiting.pop(uid, None)
            self._start(pod, uid)

    def _active(self) -> int:
        return sum(1 for r in self._runs.values() if not r.done.is_set())

    # ---- running a pod -----------------------------------------------------------
    def _start(self, pod: dict, uid: str) -> None:
        md, spec = pod["metadata"], pod.get("spec", {})
        ns, name = md.get("namespace", "default"), md["name"]
        try:
            container = (spec.get("containers") or [None])[0]
            if container is None:
                raise PodConfigError("spec.containers is empty")
            argv = self._argv(container)
            env = self._env(pod, container)
            env = self._mount_secrets(pod, container, env)
        except PodConfigError as exc:
            self._refused.add(uid)
            self._patch_status(pod, {"phase": "Failed", "reason": "CreateContainerConfigError",
                                     "message": str(exc)})
            return
        finalizers = list(md.get("finalizers") or [])
        if FINALIZER not in finalizers:
            self._patch(pod, {"metadata": {"finalizers": finalizers + [FINALIZER]},
                              "spec": {"nodeName": NODE_NAME}})
        workdir = self.log_dir / ns / name
        workdir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / ns / f"{name}.log", "ab") as out:
            proc = self._fork(argv, env=env, cwd=workdir, out=out)
            if proc is None:
                proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            else:
                self.forked_pods.append(name)
        run = _Run(ns, name, uid, proc, started=_now())
        self._runs[uid] = run
        self.started_pods.append(name)
        cname = container.get("name", "main")
        self._patch_status(pod, {
            "phase": "Running", "podIP": POD_IP, "podIPs": [{"ip": POD_IP}], "hostIP": POD_IP,
            "startTime": run.started,
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": run.started}
                           for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
            "containerStatuses": [{"name": cname, "image": container.get("image", ""), "ready": True,
                                   "imageID": "", "containerID": f"process://{proc.pid}",
                                   "restartCount": 0, "started": True,
                                   "state": {"running": {"startedAt": run.started}}}],
        })
        threading.Thread(target=self._wait, args=(run, pod, container), daemon=True,
                         name=f"nodeagent-{name}").start()

    def _fork(self, argv: list[str], *, env: dict[str, str], cwd: Path, out) -> ForkedProcess | None:
        """``argv`` forked from the zygote, or None: not ``python -m flextrain``, no zygote ready yet
        (the first such Pod starts one), or an environment it cannot serve."""
        if argv[:3] != [sys.executable, "-m", "flextrain"]:
            return None
        if not self._zygote_started:  # with what this Pod's interpreter and torch read as they start: its kind's
            self._zygote_started = True
            self._zygote = Zygote.start(env={k: v for k, v in env.items() if k in ("PATH", "HOME")
                                             or k.startswith(IMPORT_TIME)})
            return None
        if self._zygote is None or not self._zygote.ready or not self._zygote.serves(env):
            return None
        try:
            with open(os.devnull, "rb") as null:
                return self._zygote.spawn(tuple(argv[3:]), env=env, stdin=null.fileno(), stdout=out.fileno(),
                                          stderr=out.fileno(), cwd=str(cwd))
        except ZygoteGone as exc:
            log.warning("node agent: zygote gone (%s): Pods start fresh", exc)
            return None

    def _argv(self, container: dict) -> list[str]:
        argv = [*(container.get("command") or ["flextrain"]), *(container.get("args") or [])]
        if argv[0] == "flextrain":
            return [sys.executable, "-m", "flextrain", *argv[1:]]
        if argv[0] in ("python", "python3"):
            return [sys.executable, *argv[1:]]
        return argv

    def _env(self, pod: dict, container: dict) -> dict[str, str]:
        # PYTHONPATH: a test run against another checkout (a git worktree) runs its code in the pods too.
        env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "PYTHONPATH") if k in os.environ}
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["HOSTNAME"] = pod["metadata"]["name"]
        for var in container.get("env") or []:
            name = var["name"]
            if "value" in var or "valueFrom" not in var:
                env[name] = _expand(str(var.get("value", "")), env)
                continue
            ref = (var["valueFrom"] or {}).get("fieldRef")
            if not ref:
                raise PodConfigError(f"env {name}: only valueFrom.fieldRef is supported by the test node agent, "
                                     f"got {sorted(var['valueFrom'])}")
            env[name] = _field(pod, ref["fieldPath"], var=name)
        return env

    def _mount_secrets(self, pod: dict, container: dict, env: dict[str, str]) -> dict[str, str]:
        """Write the Pod's secret volumes as files; env values naming their mount paths point at them."""
        md = pod["metadata"]
        ns = md.get("namespace", "default")
        secrets = {v["name"]: v["secret"] for v in pod.get("spec", {}).get("volumes") or () if "secret" in v}
        mounted: dict[str, Path] = {}
        for mount in container.get("volumeMounts") or ():
            source = secrets.get(mount["name"])
            if source is None:
                continue
            try:
                secret = json.loads(self.core.read_namespaced_secret(source["secretName"], ns,
                                                                     _preload_content=False).data)
            except Exception as exc:  # noqa: BLE001 - a kubelet waits; the test agent says why and gives up
                raise PodConfigError(f"volume {mount['name']}: secret {source['secretName']!r}: {exc}") from exc
            local = self.log_dir / ns / md["name"] / "volumes" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            for key, value in (secret.get("data") or {}).items():
                path = local / key
                path.write_bytes(base64.b64decode(value))
                path.chmod(source.get("defaultMode", 0o644))
            mounted[mount["mountPath"].rstrip("/")] = local
        for name, value in env.items():
            for where, local in mounted.items():
                if value == where or value.startswith(where + "/"):
                    env[name] = str(local) + value[len(where):]
        return env

    def _wait(self, run: _Run, pod: dict, container: dict) -> None:
        cname, image = container.get("name", "main"), container.get("image", "")
        code = run.proc.wait()
        code = 128 - code if code < 0 else code
        with self._lock:
            run.exit_code = code
            reason = run.reason or ("Completed" if code == 0 else "Error")
            closed = self._closed
        if not run.gone and not closed:
            finished = _now()
            terminated = {"exitCode": code, "reason": reason, "startedAt": run.started, "finishedAt": finished}
            if code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
                terminated["message"] = self._log_end(run)
            self._patch_status(pod, {
                "phase": "Succeeded" if code == 0 else "Failed",
                "conditions": [{"type": t, "status": "False", "reason": "PodCompleted" if code == 0 else "PodFailed",
                                "lastTransitionTime": finished} for t in ("ContainersReady", "Ready")],
                "containerStatuses": [{"name": cname, "image": image, "ready": False, "restartCount": 0,
                                       "imageID": "", "containerID": f"process://{run.proc.pid}",
                                       "started": False,
                                       "state": {"terminated": terminated}}],
            })
        run.done.set()
        with self._lock:
            if run.terminating and not run.gone and not self._closed:
                self._release(pod)
            waiting = list(self._waiting.values())
        for other in waiting:  # a slot is free: a Pod held for capacity may start now
            self._on_event("MODIFIED", other)

    def _log_end(self, run: _Run) -> str:
        """The kubelet's fallback termination message: the log's last 80 lines, at most 2048 bytes."""
        lines = self.log(run.name, run.namespace).encode()[-2048:].splitlines()[-80:]
        return b"\n".join(lines).decode("utf-8", "replace")

    def _terminate(self, run: _Run, grace: float) -> None:
        if grace <= 0:
            self._signal(run, signal.SIGKILL)
            return
        self._signal(run, signal.SIGTERM)
        timer = threading.Timer(grace, lambda: run.done.is_set() or self._signal(run, signal.SIGKILL))
        timer.daemon = True
        timer.start()

    @staticmethod
    def _signal(run: _Run, sig: int) -> None:
        try:
            os.killpg(run.proc.pid, sig)
        except ProcessLookupError:
            pass

    # ---- API writes (never fatal: the Pod may be gone) ----------------------------
    def _patch(self, pod: dict, body: dict) -> None:
        md = pod["metadata"]
        try:
            self.core.patch_namespaced_pod(md["name"], md.get("namespace", "default"), body)
        except Exception as exc:  # noqa: BLE001 - the pod may be gone; a kubelet carries on too
            log.debug("node agent: patch of %s failed: %s", md["name"], exc)

    def _patch_status(self, pod: dict, status: dict) -> None:
        md = pod["metadata"]
        try:
            if "conditions" in status:  # a kubelet's patch merges conditions by type (the emulator replaces lists)
                current = self.core.read_namespaced_pod_status(md["name"], md.get("namespace", "default"),
                                                               _preload_content=False)
                ours = {c["type"] for c in status["conditions"]}
                kept = [c for c in (json.loads(current.data).get("status") or {}).get("conditions") or ()
                        if c.get("type") not in ours]
                status = {**status, "conditions": kept + status["conditions"]}
            self.core.patch_namespaced_pod_status(md["name"], md.get("namespace", "default"), {"status": status})
        except Exception as exc:  # noqa: BLE001 - the pod may be gone; a kubelet carries on too
            log.debug("node agent: status patch of %s failed: %s", md["name"], exc)

    def _release(self, pod: dict) -> None:
        """Remove our finalizer so a deleted Pod goes away."""
        try:
            current = self.core.read_namespaced_pod(pod["metadata"]["name"], pod["metadata"].get("namespace", "default"))
        except Exception:  # noqa: BLE001 - gone already: nothing to release
            return
        finalizers = [f for f in (current.metadata.finalizers or []) if f != FINALIZER]
        self._patch(pod, {"metadata": {"finalizers": finalizers}})

    # ---- test controls ---------------------------------------------------------------
    def _find(self, name: str, namespace: str | None = None) -> _Run:
        with self._lock:
            runs = [r for r in self._runs.values() if r.name == name and (namespace is None or r.namespace == namespace)]
        if not runs:
            raise KeyError(f"node agent has not run a pod named {name!r}")
        return runs[-1]

    def pid(self, name: str, namespace: str | None = None) -> int:
        return self._find(name, namespace).proc.pid

    def running(self) -> set[str]:
        """Names of the Pods whose process is alive."""
        with self._lock:
            return {r.name for r in self._runs.values() if not r.done.is_set()}

    def oom_kill(self, name: str, namespace: str | None = None) -> None:
        """Kill a Pod's process as the kernel's OOM killer would: SIGKILL, reason OOMKilled."""
        run = self._find(name, namespace)
        with self._lock:
            run.reason = "OOMKilled"
        self._signal(run, signal.SIGKILL)

    def preempt(self, name: str, namespace: str = "default", *, grace_seconds: int = 0) -> None:
        """Evict a Pod as the scheduler's preemption does: DisruptionTarget condition, then delete."""
        from kubernetes import client

        self.core.patch_namespaced_pod_status(name, namespace, {"status": {"conditions": [{
            "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
            "message": "preempted by a higher-priority pod", "lastTransitionTime": _now()}]}})
        self.core.delete_namespaced_pod(name, namespace, body=client.V1DeleteOptions(grace_period_seconds=grace_seconds))

    def set_capacity(self, max_pods: int | None) -> None:
        """Change how many Pods may run (None: any number); Pods held for capacity start if they now fit."""
        with self._lock:
            self.max_pods = max_pods
            waiting = list(self._waiting.values())
        for pod in waiting:
            self._on_event("MODIFIED", pod)

    def log(self, name: str, namespace: str = "default") -> str:
        path = self.log_dir / namespace / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        """Stop watching and kill every process (the node goes away)."""
        with self._lock:
            self._closed = True
            runs = list(self._runs.values())
        self._watch.stop()
        for run in runs:
            self._signal(run, signal.SIGKILL)
        for run in runs:
            try:
                run.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        if self._zygote is not None:
            self._zygote.close()


_FIELD_KEY = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def _field(pod: dict, path: str, *, var: str) -> str:
    md, spec = pod["metadata"], pod.get("spec", {})
    simple = {"metadata.name": md.get("name"), "metadata.namespace": md.get("namespace", "default"),
              "metadata.uid": md.get("uid"), "spec.nodeName": NODE_NAME,
              "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
              "status.podIP": POD_IP, "status.hostIP": POD_IP}
    if path in simple:
        return str(simple[path] or "")
    if m := _FIELD_KEY.match(path):
        return str((md.get(m.group(1)) or {}).get(m.group(2), ""))
    raise PodConfigError(f"env {var}: unsupported fieldRef.fieldPath {path!r}")


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of earlier variables in a value."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), value)
