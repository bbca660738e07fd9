"""What a script job's child reports for the script's own errors (flextrain/worker/script_child.py, failure.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from flextrain.failures import FailureKind
from flextrain.proto import flextrain_pb2 as pb


def _run_script(tmp_path, source: str):
    script = tmp_path / "script.py"
    script.write_text(source)
    failure_file = tmp_path / "failure.pb"
    proc = subprocess.run([sys.executable, "-m", "flextrain.worker.script_child", str(script)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "FLEXTRAIN_FAILURE_FILE": str(failure_file)})
    return proc.returncode, pb.Failure.FromString(failure_file.read_bytes()), script


def test_a_syntax_error_in_the_script_is_its_code_with_its_line(tmp_path):
    code, failure, script = _run_script(tmp_path, "x = 1\ndef f(:\n    pass\n")
    assert code == 3 and failure.kind == FailureKind.USER_CODE.value  # was Internal, exit 1
    assert failure.exception == "SyntaxError" and failure.location == f"{script}:2"


def test_a_scripts_sys_exit_is_told_as_its_exit_code(tmp_path):
    code, failure, script = _run_script(tmp_path, "import sys\nsys.exit(7)\n")
    assert code == 3 and failure.kind == FailureKind.USER_CODE.value
    assert failure.message == "the script exited with code 7" and failure.location == f"{script}:2 in <module>"
