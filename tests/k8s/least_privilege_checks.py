"""What a least-privileged job pod looks like (flextrain/k8s/hardening.py), as assertions over a Pod dict.

Shared by the tests that look at pods flextrain made on the emulator: the operator's master pods
(tests/k8s/operator/test_least_privilege.py) and the master's worker and PS pods
(tests/k8s/backend/test_ps_pods.py).
"""

from __future__ import annotations

from typing import Any

from podsecurity import restricted_violations

# Where a process writes besides the job directory: each must point into the scratch volume at /tmp.
SCRATCH_VARIABLES = ("HOME", "TMPDIR", "XDG_CACHE_HOME", "TORCH_HOME", "MPLCONFIGDIR")


def assert_pod_least_privileged(pod: dict[str, Any], *, token: bool, job_dir: str) -> None:
    """Read-only root filesystem; every place it writes on a writable volume; an API token only if ``token``."""
    name = pod["metadata"]["name"]
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True, name
    if token:
        assert spec.get("automountServiceAccountToken") is not False, name
    else:
        assert spec["automountServiceAccountToken"] is False, name
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert volumes[mounts["/tmp"]["name"]]["emptyDir"] == {} and not mounts["/tmp"].get("readOnly"), name
    covering = [m for path, m in mounts.items() if job_dir == path or job_dir.startswith(path.rstrip("/") + "/")]
    assert covering and not any(m.get("readOnly") for m in covering), f"{name}: nothing writable at {job_dir}"
    env = {e["name"]: e.get("value") for e in container["env"]}
    for var in SCRATCH_VARIABLES:
        assert env[var] == "/tmp" or env[var].startswith("/tmp/"), f"{name}: {var}={env.get(var)}"
    assert restricted_violations(pod) == [], name
