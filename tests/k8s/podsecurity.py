"""The Pod Security Standards' ``restricted`` profile, as rules over a Pod dict.

Written from the published standard (kubernetes.io/docs/concepts/security/pod-security-standards,
baseline + restricted controls). The emulator has no admission, so tests use this twice: to check
that flextrain's pods comply by default, and as the emulator's admission plugin for a namespace
labelled ``pod-security.kubernetes.io/enforce: restricted`` (refusing as a real API server does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
_RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}
_SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                 "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                 "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                 "net.ipv4.tcp_keepalive_probes"}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """Every way ``pod`` breaks the ``restricted`` profile (empty: it complies)."""
    spec = pod.get("spec") or {}
    psc = spec.get("securityContext") or {}
    out = []
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(host):
            out.append(f"{host}=true")
    for volume in spec.get("volumes") or ():
        kinds = set(volume) - {"name"}
        if not kinds <= _RESTRICTED_VOLUMES:
            out.append(f"volume {volume.get('name')!r} uses {sorted(kinds - _RESTRICTED_VOLUMES)}")
    for sysctl in psc.get("sysctls") or ():
        if sysctl.get("name") not in _SAFE_SYSCTLS:
            out.append(f"sysctl {sysctl.get('name')}")
    if (psc.get("seLinuxOptions") or {}).get("user") or (psc.get("seLinuxOptions") or {}).get("role"):
        out.append("pod seLinuxOptions user/role set")
    if psc.get("runAsUser") == 0:
        out.append("pod runAsUser=0")
    containers = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    for c in containers:
        name = c.get("name")
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"container {name!r}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"container {name!r}: allowPrivilegeEscalation != false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or ()):
            out.append(f"container {name!r}: capabilities.drop does not include ALL")
        if set(caps.get("add") or ()) - {"NET_BIND_SERVICE"}:
            out.append(f"container {name!r}: capabilities.add {sorted(set(caps['add']) - {'NET_BIND_SERVICE'})}")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"container {name!r}: runAsNonRoot != true")
        if sc.get("runAsUser") == 0:
            out.append(f"container {name!r}: runAsUser=0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"container {name!r}: seccompProfile.type must be RuntimeDefault or Localhost, got {seccomp}")
        for port in c.get("ports") or ():
            if port.get("hostPort"):
                out.append(f"container {name!r}: hostPort {port['hostPort']}")
        if sc.get("procMount") not in (None, "Default"):
            out.append(f"container {name!r}: procMount {sc['procMount']}")
        if (sc.get("seLinuxOptions") or {}).get("user") or (sc.get("seLinuxOptions") or {}).get("role"):
            out.append(f"container {name!r}: seLinuxOptions user/role set")
    return out


def refusal_message(pod: dict[str, Any], violations: list[str]) -> str:
    """What a real API server answers (403 Forbidden) for a pod the profile refuses."""
    return (f'pods "{pod["metadata"]["name"]}" is forbidden: violates PodSecurity "restricted:latest": '
            + ", ".join(violations))


def restricted_namespace(namespace: str) -> Callable[[Any, str | None, dict], tuple[int, str, str] | None]:
    """An emulator admission check (``cluster.admit``, tests/k8s/conftest.py): pods in ``namespace``
    must pass ``restricted``, refused as a real API server refuses them (403 Forbidden)."""
    def check(resource: Any, ns: str | None, body: dict) -> tuple[int, str, str] | None:
        if resource != "v1/pods" or ns != namespace:
            return None
        violations = restricted_violations(body)
        return (403, "Forbidden", refusal_message(body, violations)) if violations else None

    return check
