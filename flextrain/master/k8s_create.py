"""PodCreation: how the pod backend creates an instance's Pod (and a PS's Service), retrying refusals.

A mixin of :class:`~flextrain.master.k8s_backend.KubernetesPodBackend`, apart for size: it uses the
backend's ``core``, ``job``, ``namespace``, ``_lock``, ``_by_pod``, ``failed``, ``create_timeout``,
``retry_first``/``retry_cap``, the callbacks ``_on_fatal``/``_on_note`` and ``_report``/``_delete``.
The policy (permanent vs retryable refusals, backoff, what the job's status and Events say) is in
the backend's module docstring; the classification of a refusal in :mod:`flextrain.master.k8s_outcomes`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING

from flextrain.k8s.refusals import Refusal, refusal_of
from flextrain.master.k8s_status import record_event

if TYPE_CHECKING:
    from flextrain.master.k8s_backend import _Instance

log = logging.getLogger(__name__)

FAILED_CREATE = "FailedCreate"  # the Event reason Kubernetes' own controllers use for a refused create


class LaunchError(RuntimeError):
    """A launch that cannot be done (the message names the object and the reason)."""


class PodCreation:
    def _attempt(self, inst: _Instance, body: dict, service: dict | None) -> Refusal | None:
        """One try at creating the instance's Service (PS) and Pod; the caller holds the lock, so
        the watch cannot see the new Pod before its uid is known. None: created."""
        inst.attempts += 1
        if service is not None:
            try:
                self._create_service(service)
            except Exception as exc:  # noqa: BLE001 - classified: the API's refusal or no answer
                return refusal_of(exc, what=f'service "{service["metadata"]["name"]}"')
        try:
            reply = self.core.create_namespaced_pod(self.namespace, body, _preload_content=False)
        except Exception as exc:  # noqa: BLE001 - classified: the API's refusal or no answer
            refusal = refusal_of(exc, what=f'pod "{inst.pod}"')
            if refusal.exists:  # a finished earlier launch of the same name (a PS relaunch): remove it
                self._delete(inst.pod, grace=0)
            return refusal
        inst.uid, inst.created = json.loads(reply.data)["metadata"].get("uid"), time.monotonic()
        self._by_pod[inst.pod] = inst
        return None

    def _keep_trying(self, inst: _Instance, body: dict, service: dict | None, refusal: Refusal) -> None:
        """Retry a refused create with exponential backoff until it succeeds, is refused for good,
        or the instance is no longer wanted; say what the job waits for whenever that changes."""
        delay, shown = self.retry_first, None
        while True:
            if not refusal.exists and refusal.message() != shown:  # a leftover going away is routine
                shown = refusal.message()
                log.warning("%s (attempt %d)", shown, inst.attempts)
                self._on_note(shown)
                record_event(self.core, self.job, reason=FAILED_CREATE, message=shown)
            if inst.cancel.wait(delay):
                return  # terminate() or close() reported it
            with self._lock:
                if inst.reported or inst.cancel.is_set():
                    return
                refusal = self._attempt(inst, body, service)
            if refusal is None:
                log.info("created pod %s for %s after %d attempts", inst.pod, inst.instance_id, inst.attempts)
                if shown:
                    self._on_note(f"created pod {inst.pod} after {inst.attempts} attempts")
                return
            if not refusal.retryable:
                self._refused(inst, refusal)
                return
            delay = min(delay * 2, self.retry_cap)

    def _refused(self, inst: _Instance, refusal: Refusal) -> None:
        """A permanent refusal: the job fails (first such message wins), later launches are refused,
        and the instance is reported as exited (code 1)."""
        message = refusal.message()
        with self._lock:
            first = not self.failed
            self.failed = self.failed or message
        log.error("%s", message)
        record_event(self.core, self.job, reason=FAILED_CREATE, message=message)

        def fail_then_report() -> None:
            if first:
                self._on_fatal(message)
            self._report(inst.instance_id, 1, "LaunchFailed")

        # From another thread: the caller of launch() may hold its own lock, which on_fatal needs.
        threading.Thread(target=fail_then_report, daemon=True, name=f"refused-{inst.pod}").start()

    def _create_service(self, body: dict) -> dict:
        """Create the Service, or read it (a relaunched PS keeps its Service); raises what the API raised."""
        from kubernetes.client import ApiException

        try:
            reply = self.core.create_namespaced_service(self.namespace, body, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                raise
            reply = self.core.read_namespaced_service(body["metadata"]["name"], self.namespace,
                                                      _preload_content=False)
        return json.loads(reply.data)

    def _ensure_service(self, body: dict) -> dict:
        """The Service, created if need be; retryable refusals are retried with backoff for up to
        ``create_timeout`` seconds. Raises LaunchError naming the Service and the API's reason."""
        deadline, delay = time.monotonic() + self.create_timeout, self.retry_first
        while True:
            try:
                return self._create_service(body)
            except Exception as exc:  # noqa: BLE001 - classified: the API's refusal or no answer
                refusal = refusal_of(exc, what=f'service "{body["metadata"]["name"]}"')
            if not refusal.retryable:
                raise LaunchError(refusal.message())
            if time.monotonic() + delay > deadline:
                raise LaunchError(f"{refusal.message()} (for {self.create_timeout:.0f}s)")
            time.sleep(delay)  # a backoff wait, not synchronisation
            delay = min(delay * 2, self.retry_cap)



__all__ = ["FAILED_CREATE", "LaunchError", "PodCreation"]
