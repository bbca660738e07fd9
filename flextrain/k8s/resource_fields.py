"""The ElasticJob spec's fields as flextrain knows them: which map to JobSpec settings (``FIELDS``),
which describe pods (``POD_LEVEL``) or steer a running job (``CONTROL``), and the error an
ElasticJob that cannot run raises (``flextrain.k8s.resource``)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flextrain.job import SETTINGS, IntOrStr
from flextrain.k8s.template import ROLES


class ResourceError(ValueError):
    """An ElasticJob that cannot run; the message starts with the offending field path.

    ``problems`` holds every problem found (one message each, each starting with its
    path); the message is them one per line, and ``path`` is the first one's.
    """

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if not problem.startswith(path) else problem)
        self.path = path
        self.problems = [str(self)]

    @classmethod
    def of(cls, problems: Sequence[str]) -> "ResourceError":
        err = cls(path_of(problems[0]), "\n".join(problems))
        err.problems = list(problems)
        return err


def path_of(problem: str) -> str:
    """The field path a problem message starts with (``spec.training.epochs: ...`` -> ``spec.training.epochs``)."""
    return re.match(r"[^\s:]*", problem).group(0)


@dataclass(frozen=True)
class Field:
    """One CRD field that maps to one JobSpec setting (a row of ``flextrain.job.SETTINGS``)."""

    path: str  # dotted, below ``spec`` (e.g. "training.globalBatchSize")
    key: str  # the setting's key (flextrain.job.SETTING)
    kind: type  # int, float, str, bool, list (of strings) or IntOrStr (x-kubernetes-int-or-string)

    @property
    def full_path(self) -> str:
        return f"spec.{self.path}"


# The mapping, in the order ``resource_from_jobspec`` writes it: the settings table's CRD column.
FIELDS: tuple[Field, ...] = tuple(
    Field(s.crd.removeprefix("spec."), s.key, s.kind if s.kind in (int, float, str, bool, list, IntOrStr) else str)
    for s in SETTINGS if s.crd and s.crd.startswith("spec."))
# In the CRD with no behaviour yet: refused (never silently dropped) until an issue implements them.
NOT_YET: tuple[str, ...] = ()

# Fields of the spec that describe pods rather than the job: known, not JobSpec.
_POD_FIELDS = {"resources", "priorityClassName", "env", "template"}  # template: see flextrain.k8s.template
POD_LEVEL = {
    "image", "volumes", "imagePullPolicy", "replicaSpecs.master.relaunchBudget", "training.checkpointDir",
    "replicaSpecs.worker.memoryLadder",  # the memory of worker pods after OOM kills (flextrain/master/oom.py)
    *(f"replicaSpecs.{role}.{f}" for role in ROLES for f in _POD_FIELDS),
}
# Fields that steer a running job rather than describe it: the operator relays them to the master.
CONTROL = {"suspend"}  # flextrain/operator/suspending.py
REQUIRED = ("image",)  # and modelDef with what its spec.jobType needs, or script (job_types.required_problems)


def _get(obj: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = obj
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _set(obj: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        obj = obj.setdefault(part, {})
    obj[last] = value
