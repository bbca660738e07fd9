"""The Dockerfile, read statically: no container engine runs here, so CI never builds the image.

It is parsed into instructions (continuation lines joined, comments dropped)
and the facts that matter are checked: slim Python 3.11 base, torch pinned to
pyproject's version from the CPU wheel index, flextrain installed from the
source, a non-root user, and the `flextrain` entrypoint in exec form.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib

from k8s_static_support import REPO

DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs in order."""
    out, pending = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        pending += (" " if pending else "") + line.removesuffix("\\").strip()
        if not line.endswith("\\"):
            keyword, _, args = pending.partition(" ")
            out.append((keyword.upper(), args.strip()))
            pending = ""
    assert not pending, "Dockerfile ends inside a continued line"
    return out


def args_of(keyword: str) -> list[str]:
    return [args for kw, args in instructions() if kw == keyword]


def build_args() -> dict[str, str]:
    out = {}
    for args in args_of("ARG"):
        name, _, default = args.partition("=")
        out[name] = default.strip('"')
    return out


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_base_is_slim_python_311():
    (base,) = args_of("FROM")
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", base), base


def test_torch_is_pinned_to_pyprojects_cpu_wheel():
    (pin,) = [d for d in pyproject()["project"]["dependencies"] if d.startswith("torch")]
    torch_runs = [shlex.split(r) for r in args_of("RUN") if "torch" in r]
    assert len(torch_runs) == 1, torch_runs
    words = torch_runs[0]
    assert pin in words, f"Dockerfile installs torch as {words}, pyproject pins {pin}"
    index = words[words.index("--index-url") + 1]
    assert index == "${TORCH_INDEX_URL}" and build_args()["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    torch_step = next(i for i, (kw, a) in enumerate(instructions()) if kw == "RUN" and "torch" in a)
    package_step = next(i for i, (kw, a) in enumerate(instructions()) if kw == "RUN" and 'pip install ".' in a)
    assert torch_step < package_step, "torch must be installed before flextrain, or pip resolves a CUDA build"


def test_flextrain_is_installed_from_the_source_with_optional_extras():
    copies = [a.split() for a in args_of("COPY")]
    copied = {src for parts in copies for src in parts[:-1]}
    assert {"pyproject.toml", "README.md", "flextrain", "model_zoo"} <= copied
    assert any(dest == "./model_zoo" for *_, dest in copies)
    (workdir,) = args_of("WORKDIR")
    assert workdir == "/opt/flextrain"  # the examples' modelDef paths point here
    assert any(re.search(r'pip install "\.\$\{EXTRAS:\+\[\$\{EXTRAS\}\]\}"', r) for r in args_of("RUN"))
    extra = "tensorflow"
    assert extra in pyproject()["project"]["optional-dependencies"], "the documented EXTRAS value must exist"


def test_runs_as_a_non_root_user():
    users = args_of("USER")
    assert users, "no USER: the image would run as root"
    last = users[-1].split(":")[0]
    assert last not in ("root", "0"), users
    last_user_at = max(i for i, (kw, _) in enumerate(instructions()) if kw == "USER")
    assert all(kw != "RUN" for kw, _ in instructions()[last_user_at + 1:]), "RUN after USER would need root"
    assert any(f"--uid {last}" in r for r in args_of("RUN")), f"uid {last} is never created"


def test_entrypoint_is_flextrain_in_exec_form():
    (entrypoint,) = args_of("ENTRYPOINT")
    assert json.loads(entrypoint) == ["flextrain"]
    assert pyproject()["project"]["scripts"]["flextrain"] == "flextrain.cli:main"


def test_dockerignore_keeps_the_context_small_but_complete():
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "tests"} <= ignored
    needed = {"pyproject.toml", "README.md", "flextrain", "model_zoo"}
    assert not needed & ignored, needed & ignored


def test_parser_sees_continuations_and_comments():
    """The reader above is what the other checks stand on: it must join the multi-line useradd RUN."""
    runs = args_of("RUN")
    assert any("useradd" in r and "chown" in r for r in runs), runs
