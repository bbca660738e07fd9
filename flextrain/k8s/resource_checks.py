"""Per-field checks of an ElasticJob spec (``flextrain.k8s.resource``): types, value rules
translated from JobSpec's flags into CRD field paths, unknown keys, volumes, replica bounds.
Each returns problem messages that start with the field path they concern."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from flextrain.job import SETTING, IntOrStr, JobSpecError
from flextrain.k8s import kubeschema
from flextrain.k8s.resource_fields import FIELDS


_KIND_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
               list: "a list of strings", IntOrStr: "an integer or a string"}


def _type_problem(field_path: str, value: Any, kind: type) -> str | None:
    ok = {
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        bool: isinstance(value, bool),
        str: isinstance(value, str),
        list: isinstance(value, list) and all(isinstance(item, str) for item in value),
        IntOrStr: isinstance(value, (int, str)) and not isinstance(value, bool),
    }[kind]
    return None if ok else f"{field_path}: must be {_KIND_NAMES[kind]}, got {value!r}"


def _unknown_problems(spec: Mapping[str, Any], known: set[str]) -> list[str]:
    """Keys no field uses (a typo would otherwise be silently ignored)."""
    prefixes = {k.rsplit(".", i)[0] for k in known for i in range(k.count(".") + 1)}
    out: list[str] = []

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            if path in known:
                continue
            if path not in prefixes:
                out.append(f"spec.{path}: unknown field")
            elif not isinstance(value, Mapping):
                out.append(f"spec.{path}: must be an object, got {value!r}")
            else:
                walk(value, f"{path}.")

    walk(spec, "")
    return out


def _flag_map() -> dict[str, str]:
    out: dict[str, str] = {}
    for f in FIELDS:
        out["--" + f.key.replace("_", "-")] = out[SETTING[f.key].option] = f.full_path
    return out


def _translate(message: str) -> str:
    """Rewrite JobSpec's ``--flag`` names into CRD field paths."""
    flags = _flag_map()
    message = re.sub(r"--[a-z][a-z-]*", lambda m: flags.get(m.group(0), m.group(0)), message)
    return message.replace("job name", "metadata.name", 1)


def _value_problems(field_path: str, value: Any, kind: type, rule=None) -> list[str]:
    """The type, then the value rule of flextrain.job (``rule(flag, value)`` raising JobSpecError)."""
    bad = _type_problem(field_path, value, kind)
    if bad or rule is None:
        return [bad] if bad else []
    try:
        rule(f"{field_path}:", value)
    except JobSpecError as exc:
        message = _translate(str(exc))
        return [message if message.startswith(field_path) else f"{field_path}: {message}"]
    return []


def _check_memory_size(flag: str, value: Any) -> None:
    from flextrain.elastic.sizes import parse_memory

    try:
        parse_memory(value, what=flag.rstrip(":"))
    except ValueError as exc:
        raise JobSpecError(str(exc)) from None


def _checkpoint_dir_problems(checkpoint_dir: Any, job_dir: str) -> list[str]:
    where = "spec.training.checkpointDir"
    if bad := _value_problems(where, checkpoint_dir, str):
        return bad
    if checkpoint_dir.rstrip("/") != f"{job_dir.rstrip('/')}/checkpoints":
        # The ledger snapshot and the model checkpoint must stay together for an exact resume.
        return [f"{where}: {checkpoint_dir!r} is not supported yet: checkpoints go to <jobDir>/checkpoints "
                f"({job_dir}/checkpoints); set spec.jobDir instead"]
    return []


def _replica_problems(values: dict[str, Any]) -> list[str]:
    """``minReplicas <= replicas <= maxReplicas``, stated in the CRD's words.

    Drops a bound it blames from ``values``, so JobSpec's own range check does not blame it again.
    """
    base = "spec.replicaSpecs.worker"
    out = []
    replicas = values.get("workers", 1)  # counts < 1 were refused by their own rule
    lo, hi = values.get("min_workers"), values.get("max_workers")
    # minReplicas > maxReplicas always breaks one of these two, so it needs no message of its own.
    if lo is not None and lo > replicas:
        out.append(f"{base}.minReplicas ({lo}) > replicas ({replicas})")
    if hi is not None and hi < replicas:
        out.append(f"{base}.maxReplicas ({hi}) < replicas ({replicas})")
    if out:
        values.pop("min_workers", None)
        values.pop("max_workers", None)
    return out


# An ElasticJob volume is a core/v1 Volume plus these keys of the container's VolumeMount.
MOUNT_KEYS = ("mountPath", "readOnly", "subPath")


def _volume_problems(volumes: Any) -> list[str]:
    """``spec.volumes[]``: name and an absolute mountPath, and the rest a core/v1 Volume by Kubernetes' schema.

    The CRD keeps unknown fields of a volume (any volume source may appear), so without the
    schema a ``persistentVolumeClam`` would pass admission and fail only at pod creation.
    """
    if volumes is None:
        return []
    if not isinstance(volumes, list):
        return [f"spec.volumes: must be a list, got {volumes!r}"]
    out = []
    for i, volume in enumerate(volumes):
        where = f"spec.volumes[{i}]"
        if not isinstance(volume, Mapping):
            out.append(f"{where}: must be an object, got {volume!r}")
            continue
        for key in ("name", "mountPath"):
            if not isinstance(volume.get(key), str) or not volume[key]:
                out.append(f"{where}.{key}: is required")
        mount = volume.get("mountPath")
        if isinstance(mount, str) and mount and not mount.startswith("/"):
            out.append(f"{where}.mountPath: must be an absolute path, got {mount!r}")
        for key, kind in (("readOnly", bool), ("subPath", str)):
            if key in volume:
                out += _value_problems(f"{where}.{key}", volume[key], kind)
        source = {k: v for k, v in volume.items() if k not in MOUNT_KEYS}
        source.setdefault("name", "volume")  # already reported when missing
        out += [p for p in kubeschema.problems(source, "io.k8s.api.core.v1.Volume", path=where)
                if not p.startswith(f"{where}.name:")]
    return out
