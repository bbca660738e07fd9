"""``flextrain status`` / ``stop`` / ``scale`` read a job's status file or call its master: they import no
torch (about a second of CPU a call; the tests call these commands hundreds of times)."""

from __future__ import annotations

import subprocess
import sys

from ft_helpers import REPO


def test_the_status_stop_and_scale_commands_import_no_torch(tmp_path):
    code = ("import sys; import flextrain.cli, flextrain.cli.jobs, flextrain.master.status; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"imported torch: {done.stdout[:300]}"
    # and the command itself, on a directory that is no job: refused, without torch
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "flextrain", "status", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode != 0 and "no job" in done.stderr
    assert not [line for line in done.stderr.splitlines() if line.rstrip().endswith("| torch")]
