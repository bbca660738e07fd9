"""The operator's access to the Kubernetes API: ElasticJobs, master pods, Services, TLS Secrets, Events.

Everything goes through one ``kubernetes.client.ApiClient`` (the same
credentials kopf logs in with) and returns plain dicts, so unknown fields of a
newer CRD survive. A patch the API server refuses (or never answers) raises
:class:`~flextrain.k8s.refusals.Refused` naming the object and the reason. Creating an object that already exists is not an error:
every handler may run twice (operator restarts, retried handlers, a pod event
and a timer racing), and creation by deterministic name makes that harmless.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from flextrain.failures import FailureKind, kind_of_exit, signal_name
from flextrain.k8s import meta
from flextrain.k8s.refusals import Refused, refusal_of

log = logging.getLogger(__name__)



def _status_code(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


class Kube:
    """Thin, dict-based wrapper over the ``kubernetes`` client for one ApiClient."""

    def __init__(self, api_client) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    # ---- ElasticJobs -------------------------------------------------------------
    def get_job(self, namespace: str, name: str) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.custom.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, meta.PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_status(self, job: dict, status: dict[str, Any]) -> None:
        """Merge ``status`` into the job's status subresource; :class:`Refused` if the API server says no."""
        md = job["metadata"]
        self._patch(f'the status of ElasticJob "{md["name"]}"', lambda: self.custom.patch_namespaced_custom_object_status(
            meta.GROUP, meta.VERSION, md["namespace"], meta.PLURAL, md["name"], {"status": status}))

    def patch_spec(self, namespace: str, name: str, patch: dict[str, Any]) -> dict:
        """Merge-patch the job (spec or metadata); :class:`Refused` if the API server says no."""
        return self._patch(f'ElasticJob "{name}"', lambda: self.custom.patch_namespaced_custom_object(
            meta.GROUP, meta.VERSION, namespace, meta.PLURAL, name, patch))

    @staticmethod
    def _patch(what: str, call):
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return call()
        except (ApiException, HTTPError, OSError) as exc:
            raise Refused(refusal_of(exc, what=what, action="patch")) from exc

    # ---- pods and services ------------------------------------------------------
    def master_pods(self, namespace: str, job: str) -> dict[int, dict]:
        """The job's master pods by index (filtered here too: not every API server filters labels)."""
        reply = _raw(self.core.list_namespaced_pod(namespace, label_selector=meta.selector(job, "master"),
                                                   _preload_content=False))
        out: dict[int, dict] = {}
        for pod in reply.get("items", []):
            labels = (pod.get("metadata") or {}).get("labels") or {}
            if labels.get(meta.LABEL_JOB) != job or labels.get(meta.LABEL_ROLE) != "master":
                continue
            try:
                out[int(labels.get(meta.LABEL_INDEX, ""))] = pod
            except ValueError:
                continue
        return out

    def get_service(self, namespace: str, name: str) -> dict | None:
        return self._read(lambda: self.core.read_namespaced_service(name, namespace, _preload_content=False))

    @staticmethod
    def _read(call) -> dict | None:
        """The object an un-preloaded read returns; None when there is none (404)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return _raw(call())
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create_pod(self, pod: dict) -> bool:
        """Create ``pod``; False if one of that name exists already."""
        return self._create(lambda: self.core.create_namespaced_pod(pod["metadata"]["namespace"], pod))

    def create_service(self, service: dict) -> bool:
        return self._create(lambda: self.core.create_namespaced_service(service["metadata"]["namespace"], service))

    @staticmethod
    def _create(call) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            call()
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise

    # ---- the job's TLS Secret (flextrain/operator/credentials.py): never logged ----------------
    def get_secret(self, namespace: str, name: str) -> dict | None:
        return self._read(lambda: self.core.read_namespaced_secret(name, namespace, _preload_content=False))

    def create_secret(self, secret: dict) -> bool:
        """Create ``secret``; False if one of that name exists already."""
        return self._create(lambda: self.core.create_namespaced_secret(secret["metadata"]["namespace"], secret))

    def delete_secret(self, namespace: str, name: str) -> None:
        self._delete(lambda: self.core.delete_namespaced_secret(name, namespace))

    def job_objects(self, namespace: str, job: str) -> tuple[list[dict], list[dict]]:
        """Every pod (master, workers, PS) and Service of ``job``, by its label (filtered here too)."""
        selector = meta.selector(job)
        found = []
        for lister in (self.core.list_namespaced_pod, self.core.list_namespaced_service):
            items = _raw(lister(namespace, label_selector=selector, _preload_content=False)).get("items", [])
            found.append([o for o in items if ((o.get("metadata") or {}).get("labels") or {}).get(meta.LABEL_JOB) == job])
        return found[0], found[1]

    def delete_pod(self, namespace: str, name: str, *, grace: int | None = None) -> None:
        """Delete a pod (gone already: nothing to do)."""
        from kubernetes import client

        body = client.V1DeleteOptions(grace_period_seconds=grace) if grace is not None else None
        self._delete(lambda: self.core.delete_namespaced_pod(name, namespace, body=body))

    def delete_service(self, namespace: str, name: str) -> None:
        self._delete(lambda: self.core.delete_namespaced_service(name, namespace))

    @staticmethod
    def _delete(call) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            call()
        except ApiException as exc:
            if exc.status != 404:
                raise

    # ---- Volcano PodGroups (spec.scheduling.gang volcano) ---------------------------
    def ensure_pod_group(self, body: dict) -> dict:
        """Create the PodGroup ``body`` unless it exists; the PodGroup as it is now (its status: Volcano's)."""
        from flextrain.k8s.gang import PODGROUP_GROUP, PODGROUP_PLURAL, PODGROUP_VERSION

        md = body["metadata"]
        podgroups = (PODGROUP_GROUP, PODGROUP_VERSION, md["namespace"], PODGROUP_PLURAL)
        self._create(lambda: self.custom.create_namespaced_custom_object(*podgroups, body, _preload_content=False))
        return self.custom.get_namespaced_custom_object(*podgroups, md["name"])

    def delete_pod_group(self, namespace: str, name: str) -> None:
        from flextrain.k8s.gang import PODGROUP_GROUP, PODGROUP_PLURAL, PODGROUP_VERSION

        self._delete(lambda: self.custom.delete_namespaced_custom_object(
            PODGROUP_GROUP, PODGROUP_VERSION, namespace, PODGROUP_PLURAL, name))

    # ---- events -----------------------------------------------------------------
    def event(self, job: dict, *, reason: str, message: str, warning: bool = False, key: str | None = None) -> None:
        """Record a core/v1 Event on the job (``kubectl describe ej/NAME`` lists them).

        Failing to record an Event never fails the handler that wanted it. With
        ``key`` the Event's name is ``JOB.KEY.UID8``: a second Event with the same
        key on the same job (a handler run again, an operator restarted) is
        refused by the API server as existing, so it is recorded once.
        """
        md = job["metadata"]
        body = meta.job_event(job, reason=reason, message=message, warning=warning, component="operator", key=key)
        try:
            self.core.create_namespaced_event(md["namespace"], body)
        except Exception as exc:  # noqa: BLE001 - an Event is a courtesy; what it reports already happened
            if key and _status_code(exc) == 409:
                log.info("%s/%s %s: recorded already (%s)", md["namespace"], md["name"], reason, key)
                return
            log.warning("could not record event %s on %s/%s: %s", reason, md["namespace"], md["name"], exc)
        log.info("%s/%s %s: %s", md["namespace"], md["name"], reason, message)

    def events(self, namespace: str, job: str) -> list[dict]:
        """Events recorded on ``job`` (oldest first)."""
        reply = _raw(self.core.list_namespaced_event(namespace, _preload_content=False))
        items = [e for e in reply.get("items", [])
                 if (e.get("involvedObject") or {}).get("kind") == meta.KIND
                 and (e.get("involvedObject") or {}).get("name") == job]
        return sorted(items, key=lambda e: e.get("firstTimestamp") or "")


def _raw(response) -> dict:
    """The JSON of an un-preloaded client response, as a dict (no client models)."""
    try:
        return json.loads(response.data)
    finally:
        response.release_conn()


def pod_failure(pod: dict | None) -> str | None:
    """Why a master pod is gone or dead (None while it is pending, running or succeeded)."""
    if pod is None:
        return "was deleted"
    status = pod.get("status") or {}
    # A pod being deleted is still dead only once its container has exited: relaunching
    # earlier would run two masters of one job side by side.
    if status.get("phase") != "Failed":
        return None
    for cs in status.get("containerStatuses") or ():
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return f"failed (exit code {term.get('exitCode')}, {term.get('reason') or 'Error'})"
    return f"failed ({status.get('reason') or status.get('message') or 'no container status'})"


def master_failure(pod: dict | None, name: str, why: str) -> dict[str, Any]:
    """``status.failure`` for the master pod ``name`` whose loss (``why``: :func:`pod_failure`) used up
    the relaunch budget: its exit code and the kubelet's reason when it has them."""
    failure: dict[str, Any] = {"worker": name, "kind": FailureKind.INFRASTRUCTURE.value,
                               "message": f"master pod {name} {why}"}
    for cs in ((pod or {}).get("status") or {}).get("containerStatuses") or ():
        term = (cs.get("state") or {}).get("terminated") or {}
        if isinstance(term.get("exitCode"), int):
            code = term["exitCode"]
            failure.update(kind=kind_of_exit(code).value, exitCode=code, signal=signal_name(code),
                           reason=term.get("reason"))
            break
    return {k: v for k, v in failure.items() if v not in (None, "")}

