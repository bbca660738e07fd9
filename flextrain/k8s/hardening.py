"""Least privilege inside a job's pods: a read-only root filesystem and no API token where none is needed.

Applied by the pod builder (:func:`flextrain.k8s.pods.job_pod`) to every pod of a job, after the role's
template (:mod:`flextrain.k8s.template`) has been laid in, so what the user wrote wins:

* The container runs with ``readOnlyRootFilesystem: true`` unless the template's container
  ``securityContext`` sets ``readOnlyRootFilesystem`` itself (``false`` turns it off).
* What flextrain's processes write goes to volumes, never to the image's filesystem:

  - ``flextrain-scratch``, an ``emptyDir`` at ``/tmp`` (unless a volume is mounted there already,
    which then serves instead), with ``HOME``, ``TMPDIR``, ``XDG_CACHE_HOME``, ``TORCH_HOME`` and
    ``MPLCONFIGDIR`` pointing into ``/tmp`` (torch, matplotlib and Keras write caches and temporary
    files under them); a variable the user's ``env`` sets is left as the user set it.
  - ``flextrain-job-dir``, an ``emptyDir`` at the job directory (``spec.jobDir``, default
    ``/flextrain-jobs/<job>``: logs, ledger, checkpoints, status, WAL) unless a volume of the job
    (``spec.volumes``, the template's ``volumeMounts``) is mounted at it or above it. An emptyDir lives
    as long as its pod, as the image's writable layer did: mount a volume to keep the directory.

* Workers and parameter servers never call the Kubernetes API, so their pods get
  ``automountServiceAccountToken: false``; only the master's pod mounts a token (of its job's own
  ServiceAccount: :mod:`flextrain.k8s.access`). A template's ``automountServiceAccountToken`` wins
  (e.g. ``true`` for a worker that reads its data with a cloud identity bound to the ServiceAccount).

The two volume names are flextrain's: :func:`volume_problems` refuses a job that uses one of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SCRATCH_VOLUME = "flextrain-scratch"
SCRATCH_PATH = "/tmp"
JOB_DIR_VOLUME = "flextrain-job-dir"
RESERVED_VOLUMES = (SCRATCH_VOLUME, JOB_DIR_VOLUME)
# Where the processes' libraries write, all inside the scratch volume.
SCRATCH_HOME = f"{SCRATCH_PATH}/home"
SCRATCH_ENV = {
    "HOME": SCRATCH_HOME,
    "TMPDIR": SCRATCH_PATH,
    "XDG_CACHE_HOME": f"{SCRATCH_HOME}/.cache",
    "TORCH_HOME": f"{SCRATCH_HOME}/.cache/torch",
    "MPLCONFIGDIR": f"{SCRATCH_HOME}/.config/matplotlib",
}
# Roles whose processes use the Kubernetes API (flextrain/master/k8s_*.py); the others get no token.
TOKEN_ROLES = ("master",)


def covered(path: str, mount_paths: list[str]) -> bool:
    """Whether ``path`` is at or below one of ``mount_paths``."""
    path = path.rstrip("/") or "/"
    for mount in mount_paths:
        mount = mount.rstrip("/") or "/"
        if path == mount or path.startswith(mount if mount == "/" else f"{mount}/"):
            return True
    return False


def harden(pod: dict[str, Any], *, role: str, job_dir: str) -> dict[str, Any]:
    """Make ``pod`` (one container, template already applied) least-privileged as the module says; returns it."""
    spec = pod["spec"]
    container = spec["containers"][0]
    container["securityContext"].setdefault("readOnlyRootFilesystem", True)
    if role not in TOKEN_ROLES:
        spec.setdefault("automountServiceAccountToken", False)
    mounts = container.setdefault("volumeMounts", [])
    volumes = spec.setdefault("volumes", [])
    for name, path in ((SCRATCH_VOLUME, SCRATCH_PATH), (JOB_DIR_VOLUME, job_dir)):
        at = [m.get("mountPath", "") for m in mounts]
        if (path in at) if name == SCRATCH_VOLUME else covered(path, at):
            continue
        volumes.append({"name": name, "emptyDir": {}})
        mounts.append({"name": name, "mountPath": path})
    # /tmp is a volume now (ours, or the user's own): what libraries write goes there
    env = container.setdefault("env", [])
    taken = {e.get("name") for e in env}
    env += [{"name": k, "value": v} for k, v in SCRATCH_ENV.items() if k not in taken]
    for key, owner in (("volumeMounts", container), ("volumes", spec)):
        if not owner[key]:  # a pod whose every path is mounted by the user: no empty lists
            del owner[key]
    return pod


def volume_problems(spec: Mapping[str, Any]) -> list[str]:
    """A volume of ``spec.volumes`` or of a role's template named as one of flextrain's own."""
    found = [(f"spec.volumes[{i}].name", v.get("name")) for i, v in enumerate(spec.get("volumes") or ())
             if isinstance(v, Mapping)]
    for role, replica in (spec.get("replicaSpecs") or {}).items() if isinstance(spec.get("replicaSpecs"), Mapping) else ():
        template = ((replica or {}).get("template") or {}) if isinstance(replica, Mapping) else {}
        pod = (template.get("spec") or {}) if isinstance(template, Mapping) else {}
        volumes = pod.get("volumes") if isinstance(pod, Mapping) else None
        found += [(f"spec.replicaSpecs.{role}.template.spec.volumes[{i}].name", v.get("name"))
                  for i, v in enumerate(volumes if isinstance(volumes, list) else ()) if isinstance(v, Mapping)]
    return [f"{where}: {name!r} is a volume flextrain adds to every pod (the read-only root filesystem's "
            "scratch and job directory); use another name" for where, name in found if name in RESERVED_VOLUMES]


__all__ = ["JOB_DIR_VOLUME", "RESERVED_VOLUMES", "SCRATCH_ENV", "SCRATCH_PATH", "SCRATCH_VOLUME", "covered",
           "harden", "volume_problems"]
