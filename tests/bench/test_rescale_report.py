"""bench/rescale's figures: the recovery breakdown from the workers' log lines, the torchft ratios and
targets (left out of ``met`` when torchft was skipped), and the skip reason when torchft is missing."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from rescale import torchft_case  # noqa: E402
from rescale.analysis import FAILED_LINE, ROUND_LINE, recovery_breakdown, worker_log_times  # noqa: E402
from rescale.report import ratios_and_met  # noqa: E402


def test_the_breakdown_splits_kill_to_first_step_at_the_survivors_marks(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    # worker-0 fails first (10:00:00.020), worker-1 later; worker-1 starts the new round first
    (logs / "worker-0.log").write_text(
        "2026-11-26 10:00:00,020 flextrain.worker WARNING all_reduce in round 4 failed: Connection closed\n"
        "2026-11-26 10:00:00,045 flextrain.worker INFO round 5: rank 0 of 2 at version 9, max micro-batch 64\n")
    (logs / "worker-1.log").write_text(
        "2026-11-26 10:00:00,030 flextrain.worker WARNING forming round 4 failed: gone\n"
        "2026-11-26 10:00:00,041 flextrain.worker INFO round 5: rank 1 of 2 at version 9, max micro-batch 64\n")
    failed, started = worker_log_times(tmp_path, FAILED_LINE), worker_log_times(tmp_path, ROUND_LINE)
    t0 = failed["worker-0"][4] - 0.020  # the kill, 20 ms before the first failure
    steps = {"worker-1": [(t0 + 0.030, 1), (t0 + 0.047, 2)], "worker-0": [(t0 + 0.050, 2)]}
    parts = recovery_breakdown(t_kill=t0, old_round=4, new_round={"round": 5, "time": t0 + 0.035},
                               survivors=["worker-0", "worker-1"], failed=failed, started=started, steps=steps)
    assert parts == {"detect_s": 0.02, "reform_s": 0.015, "regroup_s": 0.006, "replay_s": 0.006}


def test_a_missing_mark_gives_none_for_the_parts_around_it():
    parts = recovery_breakdown(t_kill=100.0, old_round=1, new_round={"round": 2, "time": 100.05},
                               survivors=["worker-0"], failed={}, started={}, steps={})
    assert parts == {"detect_s": None, "reform_s": None, "regroup_s": None, "replay_s": None}


def _flextrain(recovery: float) -> dict:
    one = {"median": recovery, "max": recovery, "samples": [recovery]}
    return {"recovery_s": one, "join_s": {"median": 0.05, "max": 0.05, "samples": [0.05]},
            "join_from_launch_s": {"median": 2.0}}


TORCHRUN = {"killed_worker_recovery_s": 10.0, "lost_node_recovery_s": None, "new_node_join_s": None}


def test_torchft_ratios_and_targets():
    tf = {"recovery_s": {"median": 5.0}, "join_from_launch_s": {"median": 8.0},
          "steady": {"flextrain_vs_torchft": 1.9}}
    ratios, met = ratios_and_met(_flextrain(0.025), TORCHRUN, tf)
    assert ratios["torchft_recovery_over_flextrain_recovery"] == 200.0
    assert ratios["torchft_join_from_launch_over_flextrain_join_from_launch"] == 4.0
    assert ratios["flextrain_vs_torchft_steady"] == 1.9
    assert met["torchft_recovery_at_least_2x_flextrain"] and met["flextrain_steady_at_least_torchft"]
    assert met["flextrain_recovery_median_le_0.03s"]
    _, slower = ratios_and_met(_flextrain(0.05), TORCHRUN, {**tf, "steady": {"flextrain_vs_torchft": 0.9}})
    assert not slower["flextrain_recovery_median_le_0.03s"] and not slower["flextrain_steady_at_least_torchft"]


def test_a_skipped_torchft_is_left_out_of_met():
    ratios, met = ratios_and_met(_flextrain(0.04), TORCHRUN, {"skipped": "skipped (--skip-torchft)"})
    assert ratios["torchft_recovery_over_flextrain_recovery"] is None
    assert not any(key.startswith("torchft") or "torchft" in key for key in met)


def test_a_skipped_torchrun_is_left_out_of_met():
    skipped = {"killed_worker_recovery_s": None, "lost_node_recovery_s": None, "new_node_join_s": None,
               "skipped": "--skip-torchrun"}
    ratios, met = ratios_and_met(_flextrain(0.02), skipped, {"skipped": "skipped (--skip-torchft)"})
    assert ratios["torchrun_killed_worker_over_flextrain_recovery"] is None
    assert not any("torchrun" in key for key in met) and met["flextrain_recovery_median_le_0.03s"]
    _, with_torchrun = ratios_and_met(_flextrain(0.02), TORCHRUN, {"skipped": "skipped (--skip-torchft)"})
    assert with_torchrun["torchrun_killed_worker_at_least_20x_flextrain_recovery"]


def test_torchft_missing_names_the_import_error(monkeypatch):
    def fail(name):
        raise ImportError("No module named 'torchft'")

    monkeypatch.setattr(torchft_case.importlib, "import_module", fail)
    reason = torchft_case.torchft_missing()
    assert "torchft cannot be imported" in reason and "No module named 'torchft'" in reason
