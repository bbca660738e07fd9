"""A Kubernetes job's TLS material: the Secret ``<job>-tls`` and its mount into every pod of the job.

Contract (docs/security.md, "Kubernetes"):

* :func:`enabled`: ``spec.tls`` of an ElasticJob, on when absent (the CRD's default,
  ``flextrain.job.KUBERNETES_DEFAULTS``): a job without the field is as secure as the API server makes it.
* :func:`secret`: the Secret the operator creates once per job, owned by the ElasticJob (deleted with it),
  type ``kubernetes.io/tls``, its keys those of :data:`flextrain.protocol.security.FILES` (``ca.crt``,
  ``tls.crt``, ``tls.key``, ``token``); :func:`credentials_of` reads one back (the operator's own channel
  to the master). The material is made once: a relaunched master, its workers and parameter servers
  all keep the job's CA and token. Rotation is a new job.
* :func:`mount`: every pod of a job with TLS on (master, workers, parameter servers) mounts the Secret
  read-only at :data:`MOUNT_PATH` (a volume: a read-only root filesystem does not matter) and finds it
  through ``FLEXTRAIN_TLS_DIR``, which the user's env cannot override.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from flextrain.job import KUBERNETES_DEFAULTS
from flextrain.k8s import meta
from flextrain.protocol.security import ENV_DIR, FILES, JobCredentials

VOLUME = "flextrain-tls"
MOUNT_PATH = "/var/run/secrets/flextrain.dev/tls"
SECRET_TYPE = "kubernetes.io/tls"  # tls.crt and tls.key, plus our ca.crt and token
# Readable by the container's user whatever its UID (the restricted profile runs as non-root, and no fsGroup
# is imposed); the volume is this pod's own, seen by no other container.
FILE_MODE = 0o444


def enabled(job: Mapping[str, Any]) -> bool:
    """``spec.tls`` of an ElasticJob (absent: on, as the CRD defaults it)."""
    value = (job.get("spec") or {}).get("tls")
    return KUBERNETES_DEFAULTS["tls"] if value is None else bool(value)


def secret_name(job_name: str) -> str:
    return f"{job_name}-tls"


def secret(job: Mapping[str, Any], creds: JobCredentials) -> dict[str, Any]:
    """The Secret ``<job>-tls`` holding ``creds``, owned by the ElasticJob ``job`` (with metadata.uid)."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    parts = {"ca": creds.ca, "cert": creds.cert, "key": creds.key, "token": creds.token.encode()}
    return {
        "apiVersion": "v1", "kind": "Secret", "type": SECRET_TYPE,
        "metadata": {"name": secret_name(name), "namespace": namespace,
                     "labels": {meta.LABEL_JOB: name, meta.LABEL_MANAGED_BY: "flextrain"},
                     "ownerReferences": [meta.owner_reference(job)]},
        "data": {FILES[part]: base64.b64encode(data).decode() for part, data in parts.items()},
    }


def credentials_of(body: Mapping[str, Any]) -> JobCredentials:
    """The material in a Secret as the API returns it (``data`` base64); a missing key is an error naming it."""
    data = body.get("data") or {}
    name = (body.get("metadata") or {}).get("name", "?")
    missing = [key for key in FILES.values() if not data.get(key)]
    if missing:
        raise ValueError(f"Secret {name} lacks {', '.join(missing)}: not a flextrain job's TLS Secret")
    raw = {part: base64.b64decode(data[key]) for part, key in FILES.items()}
    return JobCredentials(token=raw.pop("token").decode().strip(), **raw)


def problems(spec: Mapping[str, Any]) -> list[str]:
    """``spec.volumes`` entries that would collide with the job's Secret volume (TLS on), naming the field."""
    if not enabled({"spec": spec}) or not isinstance(spec.get("volumes"), list):
        return []
    out = []
    for i, volume in enumerate(spec["volumes"]):
        if not isinstance(volume, Mapping):
            continue  # reported by the volume checks
        if volume.get("name") == VOLUME:
            out.append(f"spec.volumes[{i}].name: {VOLUME!r} is the name of the job's TLS Secret volume (spec.tls); "
                       "choose another")
        if isinstance(volume.get("mountPath"), str) and volume["mountPath"].rstrip("/") == MOUNT_PATH:
            out.append(f"spec.volumes[{i}].mountPath: {MOUNT_PATH} is where the job's TLS Secret is mounted "
                       "(spec.tls); choose another")
    return out


def mount(job: Mapping[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` (of ``job``) with the job's Secret mounted and ``FLEXTRAIN_TLS_DIR`` set, when TLS is on."""
    if not enabled(job):
        return pod
    spec = pod["spec"]
    spec["volumes"] = [*(spec.get("volumes") or ()), {
        "name": VOLUME, "secret": {"secretName": secret_name(job["metadata"]["name"]), "defaultMode": FILE_MODE}}]
    for container in spec["containers"]:
        container["volumeMounts"] = [*(container.get("volumeMounts") or ()),
                                     {"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": True}]
        container["env"] = [*(e for e in container.get("env") or () if e.get("name") != ENV_DIR),
                            {"name": ENV_DIR, "value": MOUNT_PATH}]
    return pod


__all__ = ["MOUNT_PATH", "VOLUME", "credentials_of", "enabled", "mount", "problems", "secret", "secret_name"]
