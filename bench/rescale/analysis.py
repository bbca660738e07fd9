"""flextrain's figures from one run's stamps and logs: recovery (with its breakdown) and join."""

from __future__ import annotations

import glob
import statistics
from pathlib import Path

from rescale.stamps import first_after, last_before, log_times, read_status, read_steps, rnd4, summary


FAILED_LINE = r" \S+ WARNING (?:.*? )?\w+ (?:in )?round (\d+) failed"  # the survivor's CollectiveError
ROUND_LINE = r" \S+ INFO (?:.*? )?round (\d+): rank \d+ of"  # group formed, state synced (or in sync): training starts


def worker_log_times(job_dir: Path, pattern: str) -> dict[str, dict[int, float]]:
    """``{worker id: {round: time}}`` of the first line matching ``pattern`` per round in each worker's log."""
    out = {}
    for p in glob.glob(str(job_dir / "logs" / "worker-*.log")):
        out[Path(p).stem] = {int(r): t for r, t in log_times(Path(p), pattern).items()}
    return out


def recovery_breakdown(*, t_kill: float, old_round: int, new_round: dict, survivors: list[str], failed: dict,
                       started: dict, steps: dict) -> dict:
    """Where one recovery's time went, each part from the previous mark (seconds):
    detect (kill -> the first survivor's failed collective), reform (-> the new round formed, the
    master's clock), regroup (-> the first survivor's 'round N: rank' line: group formed, state
    broadcast unless the members are in sync) and replay (-> that survivor's first committed step). None where a mark is missing."""
    detect = min((failed.get(w, {}).get(old_round) for w in survivors if failed.get(w, {}).get(old_round)),
                 default=None)
    starts = {w: started.get(w, {}).get(new_round["round"]) for w in survivors}
    first_w = min((w for w in survivors if starts[w]), key=lambda w: starts[w], default=None)
    regroup = starts[first_w] if first_w else None
    first_step = first_after(steps.get(first_w, []), regroup) if regroup else None
    marks = [t_kill, detect, new_round["time"], regroup, first_step]
    parts = {}
    for name, a, b in zip(("detect_s", "reform_s", "regroup_s", "replay_s"), marks, marks[1:]):
        parts[name] = rnd4(b - a) if a is not None and b is not None else None
    return parts


def analyse_flextrain(job_dir: Path, rdir: Path, master_log: Path, events: list[dict]) -> dict:
    s = read_status(job_dir) or {}
    history = s.get("roundHistory", [])
    steps = {Path(p).stem.removeprefix("steps-"): read_steps(p) for p in glob.glob(str(rdir / "steps-*.txt"))}
    registered: dict[str, float] = {}
    for p in glob.glob(str(job_dir / "logs" / "worker-*.log")):
        registered.update(log_times(Path(p), r" \S+ INFO (?:.*? )?(worker-\d+) registered with master"))
    launched = log_times(master_log, r" \S+ INFO (?:.*? )?launched (worker-\d+)")
    imported, opt_built = {}, {}
    for p in glob.glob(str(rdir / "import-*.txt")):
        try:
            imported[Path(p).stem.removeprefix("import-")] = float(Path(p).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    for p in glob.glob(str(rdir / "optimizer-*.txt")):
        try:
            start, took = map(float, Path(p).read_text().split()[:2])
            opt_built[Path(p).stem.removeprefix("optimizer-")] = (start, took)
        except (OSError, ValueError):
            pass

    failed, started = worker_log_times(job_dir, FAILED_LINE), worker_log_times(job_dir, ROUND_LINE)
    recov, joins, joins_launch, details = [], [], [], []
    reg_sources = set()
    for e in events:
        t_kill = e["t_kill"]
        d = {k: e[k] for k in ("kill", "victim", "victim_rank", "round", "newcomer", "t_kill")}
        after = [r for r in history if r["round"] > e["round"]]
        rec_round = after[0] if after else None
        survivors = [m for m in e["members"] if m != e["victim"]]
        if rec_round is None or e["victim"] in {m["id"] for m in rec_round["members"]}:
            d["recovery_error"] = "no round without the victim found in roundHistory"
        else:
            firsts = [first_after(steps.get(w, []), max(t_kill, rec_round["time"] - 0.001)) for w in survivors]
            firsts = [f for f in firsts if f is not None]
            naive = [first_after(steps.get(w, []), t_kill) for w in survivors]
            naive = [f for f in naive if f is not None]
            d["survivors_round"] = rec_round["round"]
            pids = {m["id"]: m["pid"] for m in rec_round["members"]}
            d["survivors_kept_their_processes"] = all(pids.get(w) == e["pids"].get(w) for w in survivors)
            d["round_formed_after_kill_s"] = rnd4(rec_round["time"] - t_kill)
            d["members_in_sync"] = rec_round.get("membersInSync")  # the round started without a state broadcast
            d["breakdown"] = recovery_breakdown(t_kill=t_kill, old_round=e["round"], new_round=rec_round,
                                                survivors=survivors, failed=failed, started=started, steps=steps)
            if firsts:
                d["recovery_s"] = rnd4(min(firsts) - t_kill)
                recov.append(min(firsts) - t_kill)
                if d["breakdown"]["detect_s"] is not None:  # what flextrain's code spends: all but the kernel's part
                    d["after_detect_s"] = rnd4(d["recovery_s"] - d["breakdown"]["detect_s"])
            else:
                d["recovery_error"] = "no survivor step after the kill"
            if naive:
                d["first_survivor_step_after_kill_s"] = rnd4(min(naive) - t_kill)
        n = e["newcomer"]
        n_steps = steps.get(n, [])
        reg = registered.get(n)
        source = "worker log"
        if reg is None and n in imported:
            reg, source = imported[n], "module import stamp"
        if n_steps and reg is not None:
            reg_sources.add(source)
            join = n_steps[0][0] - reg
            joins.append(join)
            d["join_s"] = rnd4(join)
            d["registered_after_kill_s"] = rnd4(reg - t_kill)
            if n in imported:
                d["registered_to_import_s"] = rnd4(imported[n] - reg)
            if n in opt_built:
                d["optimizer_construction_s"] = rnd4(opt_built[n][1])
                d["registered_to_optimizer_built_s"] = rnd4(sum(opt_built[n]) - reg)
            if n in launched:
                joins_launch.append(n_steps[0][0] - launched[n])
                d["join_from_launch_s"] = rnd4(n_steps[0][0] - launched[n])
                d["launch_to_registered_s"] = rnd4(reg - launched[n])
            jr = next((r for r in history if n in {m["id"] for m in r["members"]}), None)
            if jr is not None:
                d["join_round"] = jr["round"]
                d["join_round_formed_after_registration_s"] = rnd4(jr["time"] - reg)
                d["join_round_to_first_step_s"] = rnd4(n_steps[0][0] - jr["time"])
                pauses = []
                for m in jr["members"]:
                    if m["id"] == n:
                        continue
                    st = steps.get(m["id"], [])
                    before, nxt = last_before(st, jr["time"]), first_after(st, jr["time"])
                    if before is not None and nxt is not None:
                        pauses.append(nxt - before)
                if pauses:
                    d["survivors_pause_during_join_s"] = rnd4(max(pauses))
                    d["survivors_stopped_after_registration_s"] = rnd4(
                        max(last_before(steps.get(m["id"], []), jr["time"]) or reg for m in jr["members"]
                            if m["id"] != n) - reg)
        else:
            d["join_error"] = f"newcomer {n}: {'no step' if not n_steps else 'no registration time'}"
        details.append(d)

    rate = None
    all_steps = sorted(ts for st in steps.values() for ts, _ in st)
    if events and history:
        # steady 3-worker rate in the second before the first kill (any member's stamps are one per step)
        first = events[0]
        w = first["members"][0]
        st = [ts for ts, _ in steps.get(w, []) if first["t_kill"] - 1.0 <= ts < first["t_kill"]]
        rate = len(st)
    def col(key):
        return [d[key] for d in details if d.get(key) is not None]

    pauses = col("survivors_pause_during_join_s")
    return {
        "recovery_s": summary(recov),
        "recovery_after_detect_s": summary(col("after_detect_s")),
        "join_s": {**summary(joins), "registration_time_source": sorted(reg_sources) or None},
        "join_from_launch_s": summary(joins_launch),
        "survivors_pause_during_join_s": summary(pauses),
        "join_breakdown_median_s": {
            k: rnd4(statistics.median(col(k))) if col(k) else None
            for k in ("launch_to_registered_s", "registered_to_import_s", "optimizer_construction_s",
                      "registered_to_optimizer_built_s", "survivors_stopped_after_registration_s",
                      "join_round_formed_after_registration_s", "join_round_to_first_step_s")},
        "recovery_breakdown_median_s": {
            "round_formed_after_kill_s": rnd4(statistics.median(col("round_formed_after_kill_s")))
            if col("round_formed_after_kill_s") else None,
            **{k: rnd4(statistics.median(v)) if (v := [d["breakdown"][k] for d in details if d.get("breakdown")
                                                       and d["breakdown"][k] is not None]) else None
               for k in ("detect_s", "reform_s", "regroup_s", "replay_s")}},
        "survivors_kept_their_processes": all(col("survivors_kept_their_processes")) if details else None,
        "recoveries_without_broadcast": sum(1 for d in details if d.get("members_in_sync")),
        "steady_steps_per_s_3_workers": rate,
        "steps_recorded": len(all_steps),
        "rounds": s.get("rounds"),
        "final_phase": s.get("phase"),
        "final_message": s.get("message"),
        "events": s.get("events", [])[-10:],
        "details": details,
    }
