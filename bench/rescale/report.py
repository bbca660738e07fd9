"""bench/rescale's JSON: targets, ratios against the baselines, which targets are met, the method."""

from __future__ import annotations

from rescale.stamps import summary

TARGETS = {
    "flextrain_recovery_s_max": 1.0,
    "flextrain_recovery_median_s_max": 0.03,  # issue 26 item 7: toward detection + re-init
    "flextrain_join_s_max": 1.0,
    "torchrun_killed_worker_over_flextrain_recovery_min": 20.0,
    "torchft_recovery_over_flextrain_recovery_min": 2.0,  # issue 26 item 6
    "flextrain_vs_torchft_steady_min": 1.0,
}

METHOD = (
    "All times are differences of time.time() stamps on one machine. Step stamps: the optimizer of every "
    "process appends (time, n) after each optimizer.step() (flextrain: bench/rescale/zoo_digits.py, called only "
    "for committed all-reduce steps; torchrun: bench/rescale/ddp_digits.py, after DDP backward + step). "
    "Same model (64-64-10 MLP, SGD momentum 0.9, lr 0.05), digits training split, global batch 64, 1 torch "
    "thread per process. flextrain recovery: SIGKILL of one member of a steady round of 3 (ranks rotating) -> "
    "first step of a survivor after the formation of the next round (roundHistory 'time'; the survivors' "
    "in-flight step cannot count). flextrain join: replacement worker's first step - its 'registered with "
    "master' log line (asctime, local time, ms precision, parsed to epoch seconds; cross-checked against "
    "the module-import stamp written right after registration: registered_to_import_s). join_from_launch: "
    "from the master's 'launched worker-N' log line (includes python + torch import of the new process). "
    "torchrun: python -m torch.distributed.run, --rdzv-backend=c10d on 127.0.0.1, --max-restarts=3, "
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, default rendezvous timeouts (join 600 s, last_call 30 s, "
    "keep-alive 5 s x 3), --monitor-interval default; DDP script checkpoints every 10 steps and resumes on "
    "start. killed worker: --nnodes=1 --nproc-per-node=2, SIGKILL one worker -> first step of the restarted "
    "group. lost node: --nnodes=1:3 --nproc-per-node=1 agents A (is_host=1) and B (is_host=0), SIGKILL of B's "
    "agent process group and its worker -> first step of A's restarted worker. new node join: agent start "
    "(Popen) -> first step of its worker (samples: B joining A, C joining A after B was lost). Medians are "
    "reported; every sample is listed. Waits are bounded by --timeout; a case that did not finish is null with "
    "a reason. Another process using the CPU slows both systems; load_avg_1m_at_start is recorded. "
    "flextrain recovery breakdown (medians over kills): detect = kill -> the first survivor's "
    "'... in round N failed' log line (its collective's error); reform = detect -> the new round's formation "
    "(roundHistory 'time', the master's clock); regroup = formation -> the first survivor's 'round N+1: rank' "
    "log line (process group formed, state broadcast unless the members are in sync: recoveries_without_broadcast); "
    "replay = that -> its first committed step; recovery_after_detect = recovery - detect per kill (reform + "
    "regroup + replay: what is left once the kernel has closed the killed worker's connections, bench/kill_detect.py). "
    "torchft (bench/rescale/torchft_digits.py): 3 replica groups of one process each, torchft's Lighthouse "
    "(torchft_lighthouse, min_replicas 1, its default timeouts unless --torchft-heartbeat-timeout-ms) and "
    "Manager with ProcessGroupGloo, flattened gradients averaged by Manager.allreduce, OptimizerWrapper; "
    "recovery = SIGKILL of one replica -> first committed step of a survivor after the kill's failed step; "
    "join = the replacement's process start -> its first committed step. Steady: flextrain's job and the "
    "torchft replicas run at once and take turns (bench/interleave.py, the others SIGSTOP-ed), paired "
    "window ratios with a 95% bootstrap interval."
)


def ratio(a, b):
    return round(a / b, 2) if a is not None and b else None


def torchrun_figures(kw: dict, ln: dict) -> dict:
    """The torchrun section of the JSON from its killed-worker and lost-node cases."""
    kw_s = summary(kw["samples"])
    join_s = summary(ln["join_samples"])
    return {
        "killed_worker_recovery_s": kw_s["median"],
        "killed_worker_recovery_samples": kw_s["samples"],
        "lost_node_recovery_s": ln["lost_node_recovery_s"],
        "new_node_join_s": join_s["median"],
        "new_node_join_samples": join_s["samples"],
        "killed_worker_steady_steps_per_s": kw.get("steady_steps_per_s"),
        "killed_worker_details": kw["details"],
        "lost_node_details": ln.get("details", {}),
        "errors": {k: v for k, v in (("killed_worker", kw.get("error")), ("lost_node", ln.get("error"))) if v},
        "config": {"killed_worker_cmd": kw.get("cmd"), "lost_node_cmd": ln.get("cmd"),
                   "env": {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1"}},
    }


def ratios_and_met(ft: dict, tr: dict, tf: dict) -> tuple[dict, dict]:
    """Ratios of the baselines' figures to flextrain's, and which targets they meet. A side that
    did not run (torchft or torchrun skipped) gives None ratios and is left out of ``met``."""
    fr, fj, fjl = ft["recovery_s"]["median"], ft["join_s"]["median"], ft["join_from_launch_s"]["median"]
    steady = (tf.get("steady") or {}).get("flextrain_vs_torchft")
    ratios = {
        "torchrun_killed_worker_over_flextrain_recovery": ratio(tr["killed_worker_recovery_s"], fr),
        "torchrun_lost_node_over_flextrain_recovery": ratio(tr["lost_node_recovery_s"], fr),
        "torchrun_new_node_join_over_flextrain_join": ratio(tr["new_node_join_s"], fj),
        "torchrun_new_node_join_over_flextrain_join_from_launch": ratio(tr["new_node_join_s"], fjl),
        "torchft_recovery_over_flextrain_recovery": ratio((tf.get("recovery_s") or {}).get("median"), fr),
        "torchft_join_from_launch_over_flextrain_join_from_launch":
            ratio((tf.get("join_from_launch_s") or {}).get("median"), fjl),
        "flextrain_vs_torchft_steady": steady,
    }
    r_kw = ratios["torchrun_killed_worker_over_flextrain_recovery"]
    met = {
        "flextrain_recovery_median_le_1s": fr is not None and fr <= TARGETS["flextrain_recovery_s_max"],
        "flextrain_recovery_every_sample_le_1s": bool(ft["recovery_s"]["samples"]) and
        ft["recovery_s"]["max"] <= TARGETS["flextrain_recovery_s_max"],
        "flextrain_recovery_median_le_0.03s": fr is not None and fr <= TARGETS["flextrain_recovery_median_s_max"],
        "flextrain_join_median_le_1s": fj is not None and fj <= TARGETS["flextrain_join_s_max"],
        "flextrain_join_every_sample_le_1s": bool(ft["join_s"]["samples"]) and
        ft["join_s"]["max"] <= TARGETS["flextrain_join_s_max"],
    }
    if not tr.get("skipped"):
        met["torchrun_killed_worker_at_least_20x_flextrain_recovery"] = r_kw is not None and \
            r_kw >= TARGETS["torchrun_killed_worker_over_flextrain_recovery_min"]
    if not tf.get("skipped"):
        r_tf = ratios["torchft_recovery_over_flextrain_recovery"]
        met["torchft_recovery_at_least_2x_flextrain"] = r_tf is not None and \
            r_tf >= TARGETS["torchft_recovery_over_flextrain_recovery_min"]
        if not (tf.get("steady") or {}).get("skipped"):
            met["flextrain_steady_at_least_torchft"] = steady is not None and \
                steady >= TARGETS["flextrain_vs_torchft_steady_min"]
    return ratios, met
