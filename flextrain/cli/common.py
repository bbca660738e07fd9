"""What more than one ``flextrain`` command module needs.

The user-error exception and help formatter every command uses, the default
jobs directory, the job name and absolute paths a job spec is built from, the
data flags shared by train, evaluate and predict, and access to the Kubernetes
API for the commands that act on ElasticJobs. Imports no other
``flextrain.cli`` module, so every command module may import it.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

DEFAULT_JOBS_DIR = Path("flextrain-jobs")


class CLIError(Exception):
    """A user error: printed as `flextrain: error: ...`, exit code 2."""


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help once.

    Not when the help already says what the default is (``(default: --workers)``),
    and not for None/False/[] defaults, which mean "not given" rather than a value:
    ArgumentDefaultsHelpFormatter printed ``(default 1) (default: None)``.
    """

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or not action.option_strings or default is None or default is False
                or default is argparse.SUPPRESS or default == []):
            return text
        return f"{text} (default: %(default)s)"


def job_file_candidates(job: str, name: str) -> list[Path]:
    """Where a local job's ``name`` file may be: under JOB as a directory, then under ./flextrain-jobs/JOB
    (one place, for an absolute JOB)."""
    return list(dict.fromkeys((Path(job) / name, DEFAULT_JOBS_DIR / job / name)))


def none_exist(paths: list[Path]) -> str:
    """``neither A nor B exists`` (``A does not exist`` for one): what a lookup of :func:`job_file_candidates` found."""
    return f"neither {paths[0]} nor {paths[1]} exists" if len(paths) > 1 else f"{paths[0]} does not exist"


def add_metrics_flags(g) -> None:
    """``--metrics-port`` and ``--no-metrics``: the master's Prometheus endpoint (train, run)."""
    g.add_argument("--metrics-port", type=int, default=0, metavar="PORT",
                   help="serve the job's Prometheus metrics at http://HOST:PORT/metrics from the master (default 0: "
                        "a free port locally, 9464 on Kubernetes; the URL is in status.json as metricsUrl)")
    g.add_argument("--no-metrics", action="store_true", help="serve no Prometheus metrics")
    g.add_argument("--tls", action=argparse.BooleanOptionalAction, default=None,
                   help="run every channel of the job (workers, parameter servers, flextrain commands and the "
                        "operator to the master) over TLS with a token of its own: locally made in JOBDIR/tls/, "
                        "on Kubernetes in the Secret NAME-tls the operator makes (default: off locally, on with "
                        "--backend kubernetes; --no-tls turns it off there; docs/security.md)")


def add_data_flags(g) -> None:
    """--skip-unknown-files, --csv-header, --record-cache-mb and --data-secret (train, evaluate, predict)."""
    g.add_argument("--skip-unknown-files", action="store_true",
                   help="skip files under the data paths that are not RecordIO, CSV or Parquet data (and dangling "
                        "links, unreadable files), with a warning naming each; by default such a file is an error")
    g.add_argument("--csv-header", action="store_true",
                   help="the first line of every CSV data file is a header, not a record")
    g.add_argument("--record-cache-mb", type=int, metavar="MIB",
                   help="MiB of decoded RecordIO chunks each worker keeps in memory, so that later epochs take "
                        "them from there instead of the files (default: 0, off; docs/data.md)")
    g.add_argument("--data-secret", metavar="SECRET",
                   help="Kubernetes jobs: the Secret whose keys become the master's and workers' environment, "
                        "e.g. FLEXTRAIN_DATA_PASSWORD for a database URL (docs/data.md)")


# ---- job names and paths --------------------------------------------------------
def job_name(args) -> str:
    """``--job-name``, else the last part of ``--job-dir``, else the module's name (made DNS-safe)."""
    if args.job_name:
        return args.job_name
    if args.job_dir:
        base = Path(args.job_dir).name
    else:  # the module's name: path/to/deepfm_torch.py:Model or pkg.deepfm_torch.Model -> deepfm_torch
        target = args.model_def.rsplit(":", 1)[0] if ":" in args.model_def else args.model_def.rsplit(".", 1)[0]
        base = Path(target).stem if target.endswith(".py") else target.rsplit(".", 1)[-1]
    name = re.sub(r"[^a-z0-9-]+", "-", base.lower()).strip("-")
    return name[:53] or "job"


def abs_path(path: str | None) -> str | None:
    """``path`` made absolute (None or empty: None)."""
    return str(Path(path).resolve()) if path else None


def data_abs(path: str | None) -> str | None:
    """A data path made absolute: each part of a comma-separated list (unless the whole path exists).

    A database URL (flextrain.data.sql) keeps its form, with a relative SQLite file made absolute,
    and loses its password: that moves to ``FLEXTRAIN_DATA_PASSWORD`` in this process's
    environment, which the job's processes inherit, so it is written to no job spec, log or status.
    """
    from flextrain.data.sql import is_sql_url

    if is_sql_url(path):
        return _database_url(path)
    if not path or "," not in path or Path(path).exists():
        return abs_path(path)
    return ",".join(abs_path(part.strip()) for part in path.split(",") if part.strip())


def _database_url(url: str) -> str:
    import os

    from flextrain.data.sql import PASSWORD_ENV, redact, split_password

    url, password = split_password(url)
    if password is not None:
        if (os.environ.get(PASSWORD_ENV) or password) != password:
            raise CLIError(f"{redact(url)}: its password differs from the one already given (in another data URL "
                           f"or {PASSWORD_ENV}): give one password, in {PASSWORD_ENV}")
        os.environ[PASSWORD_ENV] = password
    head, sep, rest = url.partition(":///")
    if head.startswith("sqlite") and sep and rest and not rest.startswith((":memory:", "/", "?")):
        file, q, query = rest.partition("?")
        url = f"{head}:///{Path(file).resolve()}{q}{query}"
    return url


def model_def_abs(spec: str) -> str:
    """Make a file-path --model-def absolute so workers resolve it from any directory."""
    target, sep, name = spec.rpartition(":")
    if sep and (target.endswith(".py") or Path(target).is_file()):
        return f"{Path(target).resolve()}:{name}"
    return spec


# ---- Kubernetes API access ------------------------------------------------------
def api_client():
    """A Kubernetes API client (in-cluster config, else the kubeconfig); CLIError when neither works."""
    from kubernetes import client

    from flextrain.k8s import meta

    try:
        meta.load_client_config()
    except Exception as exc:  # no in-cluster config and no usable kubeconfig, whatever the cause
        raise CLIError(f"cannot reach Kubernetes: {exc} (set KUBECONFIG or run in a pod)") from exc
    return client.ApiClient()


def get_job(kube, namespace: str, name: str) -> dict:
    """The ElasticJob ``namespace/name`` (through a flextrain.operator.kube.Kube); CLIError if there is none."""
    job = kube.get_job(namespace, name)
    if job is None:
        raise CLIError(f"no ElasticJob {name!r} in namespace {namespace!r}")
    return job


__all__ = [
    "DEFAULT_JOBS_DIR",
    "CLIError",
    "HelpFormatter",
    "abs_path",
    "add_data_flags",
    "api_client",
    "data_abs",
    "get_job",
    "job_name",
    "model_def_abs",
]
