"""``flextrain validate FILE.yaml [FILE ...]``: check ElasticJobs offline, as the cluster would.

Each ElasticJob document of each file is checked, without a cluster, by

1. the CRD's OpenAPI schema (what the API server checks on ``kubectl apply``),
2. the operator's own checks (:func:`flextrain.k8s.resource.problems`): values,
   fields that contradict each other, volumes and pod templates against
   Kubernetes' schema, names flextrain reserves,
3. the model module's contract (what ``flextrain train`` checks at submission:
   required names and signatures) when ``spec.modelDef`` names a file reachable
   from the current directory; otherwise a note says it was not checked.

Every problem is printed, one per line, as ``FILE: FIELD.PATH: problem``. Exit
status: 0 all valid, 1 problems found, 2 a file that cannot be read, is not
YAML or holds no ElasticJob (or one of a wrong apiVersion). Of several files
(a glob), one that holds only other Kubernetes objects is noted and skipped,
unless no file holds an ElasticJob.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import yaml

from flextrain.cli.common import HelpFormatter
from flextrain.k8s import crdschema, meta
from flextrain.k8s.resource import path_of, problems
from flextrain.operator.jobview import accelerate_problems

VALID, INVALID, UNUSABLE = 0, 1, 2


def add_commands(sub) -> None:
    p = sub.add_parser(
        "validate", formatter_class=HelpFormatter,
        help="check ElasticJob YAML files offline (CRD schema, operator checks, model module)",
        description="Check ElasticJob YAML offline as the cluster would: the CRD's schema, the operator's "
                    "checks (values, contradicting fields, volumes and pod templates by Kubernetes' schema) and, "
                    "when spec.modelDef is reachable from here, the model module's contract. Lists every problem "
                    "as FILE: FIELD.PATH: problem. Exit status 0: valid; 1: problems; 2: a file that cannot be "
                    "read, is not YAML or holds no ElasticJob (of several files, one of other Kubernetes objects "
                    "only is skipped with a note, unless no file holds an ElasticJob).")
    p.add_argument("files", nargs="+", metavar="FILE", help="YAML file with one or more ElasticJob documents")
    p.set_defaults(fn=cmd_validate)


# validate_file's status for a file of other Kubernetes objects among several files: skipped, not an error.
SKIPPED = -1


def cmd_validate(args) -> int:
    # A single file is named on purpose: without an ElasticJob it is a mistake (2). Several files are
    # often a glob (manifests/examples/*.yaml) that also catches the PVCs and Jobs the jobs need: those
    # files are noted and skipped, unless none of the files holds an ElasticJob at all.
    among_others = len(args.files) > 1
    statuses = [validate_file(Path(f), among_others=among_others) for f in args.files]
    if SKIPPED in statuses and not any(s in (VALID, INVALID) for s in statuses):
        print(f"no {meta.KIND} in any of the {len(args.files)} files given", file=sys.stderr)
        return UNUSABLE
    return max(max(statuses), VALID)


def validate_file(path: Path, *, among_others: bool = False) -> int:
    """Check every ElasticJob of ``path``, print what was found; the exit status it deserves.

    ``among_others``: ``path`` is one of several files; one that holds only other Kubernetes objects
    (``apiVersion``, ``kind`` and ``metadata.name``) is then noted and skipped (:data:`SKIPPED`)."""
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except (OSError, UnicodeDecodeError) as exc:
        return _unusable(path, f"cannot read it: {exc}")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        return _unusable(path, f"not YAML: {where}{getattr(exc, 'problem', None) or exc}")
    jobs = [(i, d) for i, d in enumerate(docs) if isinstance(d, dict) and d.get("kind") == meta.KIND]
    if not jobs:
        kinds = ", ".join(sorted({str(d.get("kind")) if isinstance(d, dict) else type(d).__name__ for d in docs}))
        if among_others and docs and all(_kubernetes_object(d) for d in docs):
            print(f"{path}: note: no {meta.KIND} in it (found: {kinds}): skipped")
            return SKIPPED
        return _unusable(path, f"no {meta.KIND} in it (found: {kinds or 'nothing'})")
    status = VALID
    for index, job in jobs:
        where = f"{path}" if len(docs) == 1 else f"{path} (document {index + 1})"
        if job.get("apiVersion") != meta.API_VERSION:
            status = max(status, _unusable(Path(where), f"apiVersion: expected {meta.API_VERSION}, got "
                                                        f"{job.get('apiVersion')!r}"))
            continue
        found, notes = job_problems(job)
        for note in notes:
            print(f"{where}: note: {note}")
        for problem in found:
            print(f"{where}: {problem}")
        if found:
            status = max(status, INVALID)
        else:
            print(f"{where}: valid {meta.KIND} {job['metadata']['name']}")
    return status


def job_problems(job: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(every problem, notes on what was not checked) of one ElasticJob object."""
    ours = problems(job) + accelerate_problems(job)  # the operator's checks
    blamed = {path_of(p) for p in ours}
    # The operator's message is the more telling one; the schema's adds what the operator does not check.
    schema = [p for p in crdschema.problems(job) if not any(_within(path_of(p), b) for b in blamed)]
    found, notes = [*schema, *ours], []
    model_def = (job.get("spec") or {}).get("modelDef")
    if isinstance(model_def, str) and model_def and "spec.modelDef" not in blamed:
        problem, note = _module_problem(model_def)
        found += [problem] if problem else []
        notes += [note] if note else []
    return found, notes


def _kubernetes_object(doc: Any) -> bool:
    """Shaped as a Kubernetes object (what ``kubectl apply`` takes); its own schema is not checked here."""
    return (isinstance(doc, dict) and isinstance(doc.get("apiVersion"), str) and isinstance(doc.get("kind"), str)
            and isinstance((doc.get("metadata") or {}).get("name"), str))


def _within(path: str, other: str) -> bool:
    return path == other or path.startswith((f"{other}.", f"{other}["))


def _module_problem(model_def: str) -> tuple[str | None, str | None]:
    """The contract check of ``flextrain train`` on the module, when it is reachable from here."""
    target = model_def.rsplit(":", 1)[0] if ":" in model_def else model_def.rsplit(".", 1)[0]
    path_like = target.endswith(".py") or "/" in target
    if path_like:
        reachable = Path(target).is_file()
    else:  # ElasticDL's package.module.Name: a file below the current directory, or an installed module
        reachable = Path(*target.split(".")).with_suffix(".py").is_file() or _importable(target)
    if not reachable:
        return None, (f"spec.modelDef: {target} not found from {Path.cwd()} (a path inside the image?): "
                      "the model module's contract was not checked")
    from flextrain.worker.contract import ModelDefError
    from flextrain.worker.module import load_model_def

    try:
        load_model_def(model_def)
    except ModelDefError as exc:
        return f"spec.modelDef: {exc}", None
    except Exception as exc:  # noqa: BLE001 - importing the user's module ran its code; name what it raised
        return f"spec.modelDef: importing {target} raised {type(exc).__name__}: {exc}", None
    return None, None


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _unusable(path: Path, why: str) -> int:
    print(f"{path}: {why}", file=sys.stderr)
    return UNUSABLE


__all__ = ["add_commands", "cmd_validate", "job_problems", "validate_file"]
