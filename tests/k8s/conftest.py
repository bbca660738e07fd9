"""A Kubernetes API server for tests: kmock's ``KubernetesEmulator`` on loopback.

Fixtures (function scope: every test gets a fresh, empty cluster):

``k8s_cluster`` -> :class:`Cluster`
    The emulator, served over HTTP on 127.0.0.1 from a background thread with
    its own event loop, so synchronous code (the ``kubernetes`` client, the
    master, the node agent) and kopf (in its own thread/loop or process) can
    all talk to it. Attributes: ``url`` (``http://127.0.0.1:PORT``),
    ``kubeconfig`` (a kubeconfig file for subprocesses and ``kubectl``; set
    ``KUBECONFIG`` to it), ``namespace`` (``"default"``, created),
    ``emulator`` (the kmock object; read its ``objects`` only through
    ``cluster.call(fn)``, which runs ``fn()`` on the emulator's loop).
    Declared resources: ``v1/namespaces``, ``v1/pods`` (+status),
    ``v1/services``, ``v1/secrets``, ``v1/events``, ``events.k8s.io/v1/events``, Volcano's
    ``scheduling.volcano.sh/v1beta1/podgroups`` (+status), ``v1/serviceaccounts``,
    RBAC ``roles``/``rolebindings``, ``networking.k8s.io/v1/networkpolicies`` and the
    ElasticJob (from ``manifests/crd.yaml`` when it exists, else
    ``flextrain.k8s.meta``; +status, +scale).

``k8s_api`` -> ``kubernetes.client.ApiClient`` configured for the emulator
    (a private Configuration: the global default is not touched).

``k8s_kubeconfig`` -> ``Path`` of the kubeconfig file (same as ``k8s_cluster.kubeconfig``).

``node_agent`` -> :class:`nodeagent.NodeAgent` (tests/k8s/nodeagent.py), started and watching
    every namespace; runs Pods as local processes (see that module).

What the emulator adds to kmock (a real API server does all of these, and the
code under test relies on them): ``metadata.uid``, ``creationTimestamp``,
``resourceVersion`` and ``generateName`` on create, answered with 201; ``kind``/``apiVersion`` on
objects and list replies and ``groupVersion: v1`` in core discovery (``kubectl get``
needs them); a Service gets
``clusterIP: 127.0.0.1`` (every pod runs on this host, so a Service's port must
be the port its backing process listens on -- jobs in tests pick free ports);
a new Pod starts ``Pending``; ``metadata.deletionGracePeriodSeconds`` from a
delete's ``gracePeriodSeconds`` (graceful deletion is then the node agent's
job, through its finalizer); a watch takes its bus position before listing, so
no event between the listing and the stream is lost.

Admission: ``cluster.admit(check)`` adds a check that sees every create as
``check(resource, namespace, body)`` (``resource`` compares equal to strings
like ``"v1/pods"``) and refuses it by returning ``(code, reason, message)``,
answered as a real API server's ``Status`` (e.g. 403 Forbidden for quota or
PodSecurity, 422 Invalid); ``podsecurity.restricted_namespace(ns)`` is the
PodSecurity ``restricted`` profile as such a check. ``cluster.admit_patch(check)``
does the same for patches: ``check(resource, namespace, name, subresource, body)``
(``subresource`` is ``"status"`` for a status patch, else None), e.g. a
validating webhook that refuses the status a controller writes.

Known limits: no field selectors, no label-selector filtering on the server
(filter on the client), no admission/validation of its own, no garbage
collection by ownerReferences (tests assert the references instead).
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import kmock
import pytest
import yaml
from kmock._internal import enums, rendering

from flextrain.k8s import meta

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "manifests" / "crd.yaml"
NAMESPACE = "default"
SERVICE_CLUSTER_IP = "127.0.0.1"

_CORE = {  # resource -> (kind, namespaced, subresources)
    "v1/namespaces": ("Namespace", False, set()),
    "v1/pods": ("Pod", True, {"status"}),
    "v1/services": ("Service", True, {"status"}),
    "v1/secrets": ("Secret", True, set()),  # spec.tls: a job's <job>-tls
    "v1/events": ("Event", True, set()),
    "events.k8s.io/v1/events": ("Event", True, set()),
    # Volcano's PodGroup (spec.scheduling.gang volcano): Volcano itself cannot run here; a test writes its phase.
    "scheduling.volcano.sh/v1beta1/podgroups": ("PodGroup", True, {"status"}),
    # A job's least privilege (flextrain.operator.access): its master's identity and NetworkPolicies.
    "v1/serviceaccounts": ("ServiceAccount", True, set()),
    "rbac.authorization.k8s.io/v1/roles": ("Role", True, set()),
    "rbac.authorization.k8s.io/v1/rolebindings": ("RoleBinding", True, set()),
    "networking.k8s.io/v1/networkpolicies": ("NetworkPolicy", True, set()),
}
_VERBS = {"create", "delete", "get", "list", "patch", "update", "watch"}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def elasticjob_resource() -> tuple[str, kmock.ResourceInfo]:
    """The ElasticJob resource key and info: from manifests/crd.yaml if present, else meta.py."""
    plural, kind, short, singular = meta.PLURAL, meta.KIND, [meta.SHORT_NAME], meta.SINGULAR
    group, version, subresources = meta.GROUP, meta.VERSION, {"status", "scale"}
    if CRD_PATH.exists():
        crd = next(d for d in yaml.safe_load_all(CRD_PATH.read_text())
                   if d and d.get("kind") == "CustomResourceDefinition")
        spec = crd["spec"]
        names = spec["names"]
        group, plural, kind = spec["group"], names["plural"], names["kind"]
        singular, short = names.get("singular", singular), names.get("shortNames", short)
        served = next(v for v in spec["versions"] if v.get("storage", v.get("served")))
        version, subresources = served["name"], set(served.get("subresources", {}))
    info = kmock.ResourceInfo(kind=kind, namespaced=True, singular=singular, shortnames=set(short),
                              verbs=_VERBS, subresources=subresources)
    return f"{group}/{version}/{plural}", info


@attrs.frozen
class Refused(kmock.KubernetesError):
    """An admission check's "no", rendered by kmock as a core/v1 Status with this code."""

    status: int = 403
    reason: str = "Forbidden"
    message: str = ""


@attrs.define(kw_only=True)
class FlexEmulator(kmock.KubernetesEmulator):
    """kmock's emulator plus the server-side behaviour listed in the module docstring."""

    _versions: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    admission: list[Callable[[Any, str | None, dict], tuple[int, str, str] | None]] = attrs.field(
        factory=list, init=False)
    patch_admission: list[Callable[[Any, str | None, str, str | None, dict], tuple[int, str, str] | None]] = (
        attrs.field(factory=list, init=False))

    def _kind_of(self, resource: kmock.resource) -> tuple[str | None, str]:
        info = self.resources[resource] if resource in self._get_resources() else None
        api_version = f"{resource.group}/{resource.version}" if resource.group else resource.version
        return (info.kind if info is not None else None), api_version

    async def _handle(self, request: rendering.Request) -> Any:
        data = request.data
        if request.resource is not None and isinstance(data, dict):
            if request.action == enums.action.CREATE:
                namespace = request.namespace or (data.get("metadata") or {}).get("namespace")
                for check in list(self.admission):
                    refused = check(request.resource, namespace, data)
                    if refused is not None:
                        code, reason, message = refused
                        raise Refused(status=code, reason=reason, message=message)
                self._on_create(request, data)
            elif request.action == enums.action.UPDATE and request.name is not None:
                for patch_check in list(self.patch_admission):
                    refused = patch_check(request.resource, request.namespace, request.name, request.subresource, data)
                    if refused is not None:
                        code, reason, message = refused
                        raise Refused(status=code, reason=reason, message=message)
                data.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
        if request.action == enums.action.DELETE and request.name is not None and isinstance(data, dict):
            grace = data.get("gracePeriodSeconds")
            key = (request.resource, request.namespace, request.name)
            if grace is not None and key in self.objects and not self.objects[key].deleted:
                async with self._lock:
                    self.objects[key].patch({"metadata": {"deletionGracePeriodSeconds": int(grace)}})
        response = await super()._handle(request)
        if request.action == enums.action.CREATE and response.status == 200 and not response.prepared:
            response.set_status(201)  # "Created", as a real API server answers (clients map replies by code)
        return response

    def _on_create(self, request: rendering.Request, data: dict) -> None:
        metadata = data.setdefault("metadata", {})
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]
        if request.namespace and not metadata.get("namespace"):
            metadata["namespace"] = request.namespace
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("creationTimestamp", _now())
        metadata["resourceVersion"] = str(next(self._versions))
        kind, api_version = self._kind_of(request.resource)
        if kind:
            data.setdefault("kind", kind)
        data.setdefault("apiVersion", api_version)
        if request.resource == "v1/services":
            spec = data.setdefault("spec", {})
            if spec.get("clusterIP") in (None, ""):
                spec["clusterIP"] = SERVICE_CLUSTER_IP
                spec["clusterIPs"] = [SERVICE_CLUSTER_IP]
        elif request.resource == "v1/pods":
            data.setdefault("status", {}).setdefault("phase", "Pending")

    async def _serve_list(self, request: rendering.Request) -> Any:
        reply = dict(await super()._serve_list(request))
        kind, api_version = self._kind_of(request.resource)
        reply.update(kind=f"{kind or 'Object'}List", apiVersion=api_version)
        return reply

    async def _serve_version(self, request: rendering.Request) -> Any:
        reply = dict(await super()._serve_version(request))
        reply["groupVersion"] = reply["groupVersion"].lstrip("/")  # core is "v1", not "/v1"
        return reply

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[Any]:
        # kmock lists first and subscribes afterwards; events in between would be lost.
        yield b""
        bus = self._buses[request.resource]
        async with self._lock:
            mark = await bus.mark()
            events = [{"type": "ADDED", "object": o.raw} for (res, _, _), o in self.objects.items()
                      if res == request.resource and not o.deleted and _matches(request, o.raw)]
        try:
            for event in events:
                yield event
            async for event in bus.stream(since=mark):
                if _matches(request, event.get("object") or {}):
                    yield event
        finally:
            await bus.unmark(mark)


def _matches(request: rendering.Request, obj: dict) -> bool:
    """Is an object of the watched resource in the watched namespace (and of the watched name)?"""
    md = obj.get("metadata", {}) or {}
    return ((request.namespace is None or md.get("namespace") == request.namespace)
            and (request.name is None or md.get("name") == request.name))


class Cluster:
    """The emulator running in its own thread and loop (see the module docstring)."""

    def __init__(self, tmp: Path) -> None:
        self.namespace = NAMESPACE
        self.url = ""
        self.emulator: FlexEmulator | None = None
        self.kubeconfig = tmp / "kubeconfig"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="k8s-emulator")

    def start(self) -> Cluster:
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"the Kubernetes emulator did not start: {self._error!r}")
        self.kubeconfig.write_text(yaml.safe_dump(self.kubeconfig_dict()))
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with FlexEmulator() as emulator, kmock.Server(emulator) as server:
            for key, (kind, namespaced, subresources) in _CORE.items():
                emulator.resources[key] = kmock.ResourceInfo(kind=kind, namespaced=namespaced, verbs=_VERBS,
                                                             subresources=subresources)
            key, info = elasticjob_resource()
            emulator.resources[key] = info
            emulator.objects["v1/namespaces", None, NAMESPACE] = {
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": NAMESPACE, "uid": str(uuid.uuid4()), "creationTimestamp": _now()}}
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def call(self, fn: Callable[[], Any], *, timeout: float = 10.0) -> Any:
        """Run ``fn()`` on the emulator's loop (safe access to ``emulator.objects``)."""
        async def run() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def admit(self, check: Callable[[Any, str | None, dict], tuple[int, str, str] | None]) -> Callable[[], None]:
        """Add an admission check (see the module docstring); returns a function that removes it."""
        self.call(lambda: self.emulator.admission.append(check))
        return lambda: self.call(lambda: self.emulator.admission.remove(check))

    def admit_patch(self, check: Callable[[Any, str | None, str, str | None, dict], tuple[int, str, str] | None]
                    ) -> Callable[[], None]:
        """Add a patch admission check (see the module docstring); returns a function that removes it."""
        self.call(lambda: self.emulator.patch_admission.append(check))
        return lambda: self.call(lambda: self.emulator.patch_admission.remove(check))

    def kubeconfig_dict(self) -> dict:
        return {
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "test-token"}}],
            "contexts": [{"name": "emulator",
                          "context": {"cluster": "emulator", "user": "tester", "namespace": NAMESPACE}}],
        }

    def api_client(self):
        from kubernetes import client

        config = client.Configuration()
        config.host = self.url
        config.api_key = {"authorization": "test-token"}
        config.api_key_prefix = {"authorization": "Bearer"}
        return client.ApiClient(config)

    def close(self) -> None:
        if self._stop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()


@pytest.fixture
def k8s_cluster(tmp_path) -> Cluster:
    cluster = Cluster(tmp_path).start()
    yield cluster
    cluster.close()


@pytest.fixture
def k8s_kubeconfig(k8s_cluster) -> Path:
    return k8s_cluster.kubeconfig


@pytest.fixture
def k8s_api(k8s_cluster):
    api = k8s_cluster.api_client()
    yield api
    api.close()


@pytest.fixture
def node_agent(k8s_cluster, tmp_path):
    from nodeagent import NodeAgent

    agent = NodeAgent(k8s_cluster.api_client(), kubeconfig=k8s_cluster.kubeconfig,
                      log_dir=tmp_path / "pod-logs").start()
    yield agent
    agent.close()


@pytest.fixture
def operator(k8s_cluster, k8s_api):
    """The real operator (kopf) handling this cluster's namespace (tests/k8s/operator_support.py)."""
    from operator_support import Operator

    op = Operator(k8s_api, k8s_cluster.namespace, sweep_interval=1.0).start()
    yield op
    op.close()


@pytest.fixture
def jobs(k8s_cluster, k8s_api):
    """ElasticJob helpers (create, status, events, pods) for this cluster's namespace."""
    from operator_support import Jobs

    return Jobs(k8s_api, k8s_cluster.namespace)
